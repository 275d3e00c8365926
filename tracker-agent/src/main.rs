//! resource-tracker: parses the command line, resolves it into one `Settings` and
//! hands that to a session; the work lives in the modules.

mod collect;
mod discovery;
mod engine;
mod fsafe;
mod model;
mod selfcost;
mod session;
mod settings;
mod sink;
mod warn;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .init();
    let get_env = |k: &str| std::env::var_os(k);
    if let Err(e) = settings::check_flag_env(&get_env) {
        warn::say(&e);
        std::process::exit(2);
    }
    let cli = match settings::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                // One line naming the problem, not clap's usage block.
                let text = e.render().to_string();
                let first = text.lines().next().unwrap_or("invalid arguments");
                let first = first.strip_prefix("error: ").unwrap_or(first);
                warn::say(format_args!("{first} (see --help)"));
                std::process::exit(2);
            }
        },
    };
    let settings = match settings::resolve(cli, &get_env) {
        Ok(s) => s,
        Err(e) => {
            warn::say(&e);
            std::process::exit(2);
        }
    };
    match session::run(settings) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            warn::say(format_args!("{e:#}"));
            std::process::exit(1);
        }
    }
}
