//! resource-tracker: CLI parsing and wiring only; the work lives in the modules.

mod agent;
mod cli;
mod collect;
mod config;
mod csv;
mod discovery;
mod engine;
mod launcher;
mod output;
mod sample;
mod sampler;
mod selfcost;
mod stream;
mod summary;
mod warn;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .init();
    let cli = match cli::Cli::try_parse() {
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
                eprintln!("resource-tracker: {first} (see --help)");
                std::process::exit(2);
            }
        },
    };
    let (opts, cmd) = match cli.command {
        Some(cli::Command::Run { opts, cmd }) => (opts, cmd),
        None => (cli.opts, cli.cmd),
    };
    let settings = match config::resolve(&opts, &|k| std::env::var_os(k)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("resource-tracker: {e}");
            std::process::exit(2);
        }
    };
    match agent::execute(agent::Plan {
        opts,
        settings,
        cmd,
    }) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("resource-tracker: {e:#}");
            std::process::exit(1);
        }
    }
}
