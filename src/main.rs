fn main() -> std::process::ExitCode {
    mailslot::cli::run(<mailslot::cli::Cli as clap::Parser>::parse())
}
