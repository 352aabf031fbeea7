//! `ratelimit-check [--allow-none] FILE...`: checks every rate-limit filter config in each file
//! with the filter's own validation. Exit status: 0 all valid; 1 a config is invalid, or a file
//! holds none (with `--allow-none`: the files all together hold none); 2 a file cannot be read
//! or is neither JSON nor YAML.

use std::process::ExitCode;

use ratelimit_check::{find, summary};

const USAGE: &str = "usage: ratelimit-check [--allow-none] FILE...
Checks every rate-limit filter config in each FILE (the filter's JSON, an Envoy config,
Kubernetes manifests) with the filter's own validation, and prints what each policy does.
  --allow-none  a file may hold no filter config, as long as the files together hold one
                (a set of manifests where only some files carry the config)
Exit status: 0 all valid, 1 an invalid config or a file without one, 2 an unreadable file.";

fn main() -> ExitCode {
    let mut allow_none = false;
    let mut files = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--allow-none" => allow_none = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if arg.starts_with('-') && arg != "-" => {
                eprintln!("ratelimit-check: unknown option {arg}\n{USAGE}");
                return ExitCode::from(2);
            }
            _ => files.push(arg),
        }
    }
    if files.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let mut worst = 0;
    let mut configs = 0;
    for file in &files {
        let (status, found) = check_file(file, allow_none);
        worst = worst.max(status);
        configs += found;
    }
    if allow_none && configs == 0 && worst < 2 {
        eprintln!("no rate-limit filter config in any of the files");
        worst = 1;
    }
    ExitCode::from(worst)
}

/// Checks one file and prints its findings; returns its exit status and how many configs it holds.
fn check_file(file: &str, allow_none: bool) -> (u8, usize) {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("{file}: cannot read: {error}");
            return (2, 0);
        }
    };
    let found = match find(&text) {
        Ok(found) => found,
        Err(error) => {
            eprintln!("{file}: not valid YAML or JSON: {error}");
            return (2, 0);
        }
    };
    if found.is_empty() {
        if allow_none {
            println!("{file}: no rate-limit filter config");
            return (0, 0);
        }
        eprintln!("{file}: no rate-limit filter config found");
        return (1, 0);
    }
    let mut status = 0;
    for config in &found {
        let mut place = format!("{file}: document {}", config.document);
        if let Some(object) = &config.object {
            place.push_str(&format!(" ({object})"));
        }
        if !config.path.is_empty() {
            place.push_str(&format!(": {}", config.path));
        }
        match &config.result {
            Ok(parsed) => print!("{place}: OK\n{}", summary(parsed)),
            Err(error) => {
                eprintln!("{place}: invalid filter configuration: {error}");
                if let Some(note) = config.note {
                    eprintln!("  note: {note}");
                }
                status = 1;
            }
        }
    }
    (status, found.len())
}
