//! Shared command-line plumbing of the project's binaries.

/// Parses `args` into `T`; on a usage error prints ONE line (clap's message
/// with its hints folded in) prefixed by the program name and exits with 2.
/// Help and version requests print normally and exit 0.
pub fn parse_or_exit<T: clap::Parser>(program: &str, args: impl IntoIterator<Item = String>) -> T {
    match T::try_parse_from(args) {
        Ok(t) => t,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let line: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .collect();
            eprintln!("{program}: {}", line.join(" "));
            std::process::exit(2);
        }
    }
}
