#[cfg(unix)]
fn main() -> std::process::ExitCode {
    mailslot::cli::run(mailslot::cli::parse())
}

/// mailslot needs Unix (sockets for the session doorbells, signals for the local relay, file
/// modes for keys); on Windows it builds, so that installers get this error and not a compile
/// failure, and says so (decisions: "Linux and macOS; Windows says so").
#[cfg(not(unix))]
fn main() -> std::process::ExitCode {
    eprintln!(
        "mailslot: Windows is not supported yet: the doorbells, the local relay and the key files \
         rely on Unix sockets, signals and file modes. Run mailslot under WSL, where the Linux \
         build installs."
    );
    std::process::ExitCode::from(2)
}
