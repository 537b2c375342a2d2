//! `gpuledger`: one binary, one subcommand per component. The components are libraries; this file
//! only parses the command line and turns errors into exit codes.

mod cmd;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cmd::Cli::parse_with_env() {
        Ok(cli) => cli,
        Err(e) => {
            let command = cmd::Cli::command_with_env();
            return gpuledger_otel::process::report_parse_error(&e, command.get_subcommands());
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
