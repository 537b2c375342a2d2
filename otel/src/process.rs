//! What every gpuledger binary does the same way around its work: one environment variable per
//! option, the note that says a bad value came from one, the runtime, and the stop signals.
//! The role binaries (`gpuledger-exporter`, `gpuledger-reclaimer`) and the combined `gpuledger`
//! share it, so an option is set by the same variable whichever binary runs the role.

/// `command` with `GPULEDGER_<NAME>_<FLAG>` as the environment variable of every option that
/// takes a value and names none itself (`name` is the role: `exporter`, `aggregator`…).
pub fn with_env(mut command: clap::Command, name: &str) -> clap::Command {
    let missing: Vec<(clap::Id, String)> = command
        .get_arguments()
        .filter(|a| a.get_env().is_none() && a.get_action().takes_values())
        .filter_map(|a| Some((a.get_id().clone(), a.get_long()?.to_owned())))
        .collect();
    for (id, long) in missing {
        let var = env_var(name, &long);
        // clap keeps environment variable names as &'static; these are made once per process.
        let var: &'static str = Box::leak(var.into_boxed_str());
        command = command.mut_arg(id, |a| a.env(var));
    }
    command
}

/// `command` with each option's default appended to its help (`[default: 5s]`), from
/// `defaults`: (the option's id, the default as shown). A role declares each default once, as
/// the constant its `resolve()` fills in, and lists it for here; `--help` and docs/config.md show
/// it from this, so no default is written into a doc comment to drift from the code.
///
/// Panics when `defaults` names an option `command` does not have: each role's tests build its
/// command with its list.
pub fn with_defaults(
    mut command: clap::Command,
    defaults: &[(&'static str, String)],
) -> clap::Command {
    for (id, _) in defaults {
        assert!(
            command.get_arguments().any(|a| a.get_id() == *id),
            "a default for {id}, which is not an option of {}",
            command.get_name()
        );
    }
    // In place, so that `--help` and docs/config.md keep the declaration order.
    command = command.mut_args(|a| {
        let Some((_, shown)) = defaults.iter().find(|(id, _)| a.get_id() == *id) else {
            return a;
        };
        let add = |h: Option<&clap::builder::StyledStr>| {
            format!(
                "{} [default: {shown}]",
                h.map(|h| h.to_string()).unwrap_or_default()
            )
        };
        let long = a.get_long_help().map(|h| add(Some(h)));
        let short = add(a.get_help());
        let a = a.help(short);
        match long {
            Some(l) => a.long_help(l),
            None => a,
        }
    });
    command
}

/// For a role's test of [`with_defaults`]: `command` (the role's options) with `defaults` shown,
/// checked to state each default once, at the end of its help; and the command line that gives
/// each default back as its flag (those in `described` left out: a default told in words, or one
/// meaningless alone), which the test resolves against no flags at all.
pub fn defaults_as_flags(
    command: clap::Command,
    defaults: &[(&'static str, String)],
    described: &[&str],
) -> Vec<String> {
    let command = with_defaults(command, defaults);
    let mut args = vec![command.get_name().to_owned()];
    for (id, shown) in defaults {
        let arg = command
            .get_arguments()
            .find(|a| a.get_id() == *id)
            .expect("with_defaults checked it");
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert_eq!(help.matches("[default:").count(), 1, "{id}: {help}");
        assert!(
            help.ends_with(&format!("[default: {shown}]")),
            "{id}: {help}"
        );
        if !described.contains(id) {
            args.push(format!("--{}", arg.get_long().expect("a flag")));
            args.push(shown.clone());
        }
    }
    args
}

/// A duration as an option's default shows it: in its largest whole unit (`400days`, `48h`,
/// `5m`, `10s`, `250ms`), which `humantime` reads back.
pub fn shown_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    for (unit, name) in [
        (86_400_000, "days"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ] {
        if ms >= unit && ms % unit == 0 {
            return format!("{}{name}", ms / unit);
        }
    }
    format!("{ms}ms")
}

/// The environment variable of option `--long` of role `name`.
pub fn env_var(name: &str, long: &str) -> String {
    format!("GPULEDGER_{name}_{long}")
        .to_ascii_uppercase()
        .replace('-', "_")
}

/// The environment variable that supplied the value a parse error is about, when one did (clap
/// names only the flag). `commands` are the commands whose options it may be.
pub fn env_source<'a>(
    e: &clap::Error,
    commands: impl IntoIterator<Item = &'a clap::Command>,
) -> Option<String> {
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
    commands
        .into_iter()
        .flat_map(|c| c.get_arguments())
        .filter(|a| a.get_long() == Some(long))
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .find(|v| std::env::var_os(v).is_some())
}

/// Prints a parse error (and where its value came from) and gives its exit code.
pub fn report_parse_error<'a>(
    e: &clap::Error,
    commands: impl IntoIterator<Item = &'a clap::Command>,
) -> std::process::ExitCode {
    let from_env = env_source(e, commands);
    let code = e.exit_code();
    let _ = e.print();
    if let Some(var) = from_env {
        eprintln!("note: that value came from the environment variable {var}");
    }
    std::process::ExitCode::from(code as u8)
}

/// Parses a role binary's command line (`T`, with [`with_env`] for `role`); on a parse error
/// (or `--help`) prints it and gives the exit code to return.
pub fn parse<T: clap::Parser>(
    role: &str,
    defaults: &[(&'static str, String)],
) -> Result<T, std::process::ExitCode> {
    let command = with_defaults(with_env(T::command(), role), defaults);
    command
        .clone()
        .try_get_matches()
        .and_then(|m| T::from_arg_matches(&m))
        .map_err(|e| report_parse_error(&e, [&command]))
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// A multi-threaded runtime for the services.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_default_duration_is_shown_in_its_largest_whole_unit() {
        use std::time::Duration;
        for (d, shown) in [
            (Duration::from_secs(400 * 86_400), "400days"),
            (Duration::from_secs(48 * 3600), "2days"),
            (Duration::from_secs(36 * 3600), "36h"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_millis(1500), "1500ms"),
        ] {
            assert_eq!(super::shown_duration(d), shown);
            assert_eq!(
                humantime::parse_duration(shown).unwrap(),
                d,
                "{shown} reads back"
            );
        }
    }

    #[test]
    fn every_option_that_takes_a_value_gets_its_variable() {
        let command = clap::Command::new("x")
            .arg(clap::Arg::new("listen").long("listen-addr"))
            .arg(clap::Arg::new("own").long("own").env("MY_OWN"))
            .arg(
                clap::Arg::new("once")
                    .long("once")
                    .action(clap::ArgAction::SetTrue),
            );
        let command = super::with_env(command, "exporter");
        let env = |id: &str| {
            command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(
            env("listen").as_deref(),
            Some("GPULEDGER_EXPORTER_LISTEN_ADDR")
        );
        assert_eq!(env("own").as_deref(), Some("MY_OWN"));
        assert_eq!(env("once"), None);
    }
}
