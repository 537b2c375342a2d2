//! `gpuledger`: one binary, one subcommand per component. The components are libraries; this file
//! only parses the command line and turns errors into exit codes.

mod cmd;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cmd::Cli::parse_with_env() {
        Ok(cli) => cli,
        Err(e) => {
            let from_env = env_source(&e);
            let code = e.exit_code();
            let _ = e.print();
            if let Some(var) = from_env {
                eprintln!("note: that value came from the environment variable {var}");
            }
            return ExitCode::from(code as u8);
        }
    };
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuledger: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The environment variable that supplied the value a parse error is about, when one did (clap
/// names only the flag): every option of the services can be set as `GPULEDGER_<COMMAND>_<FLAG>`.
fn env_source(e: &clap::Error) -> Option<String> {
    let clap::error::ContextValue::String(flag) = e.get(clap::error::ContextKind::InvalidArg)?
    else {
        return None;
    };
    let long = flag.trim_start_matches("--").split([' ', '=']).next()?;
    let on_command_line =
        std::env::args().any(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
    if on_command_line {
        return None;
    }
    let command = cmd::Cli::command_with_env();
    command
        .get_subcommands()
        .flat_map(|c| c.get_arguments())
        .filter(|a| a.get_long() == Some(long))
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .find(|v| std::env::var_os(v).is_some())
}
