//! `kvslots-sim`: see the library's `cli` module.

use clap::Parser;

fn main() {
    let cli = kvslots_sim::cli::Cli::parse();
    let code = kvslots_sim::cli::run(&cli, &mut std::io::stdout().lock());
    std::process::exit(code);
}
