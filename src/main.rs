fn main() -> std::process::ExitCode {
    mailslot::cli::run(mailslot::cli::parse())
}
