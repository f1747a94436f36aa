//! `kvslots-sim`: see the library's `cli` module.

use clap::Parser;

fn main() {
    // clap's own handling of a command line it cannot parse (its message,
    // in colour on a terminal, and its exit code: 2, or 0 for `--help`);
    // `cli::main_with` does the same in plain text.
    let cli = kvslots_sim::cli::Cli::parse();
    let code = kvslots_sim::cli::run(
        &cli,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    std::process::exit(code);
}
