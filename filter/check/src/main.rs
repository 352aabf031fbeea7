//! `ratelimit-check [--allow-none] [--probe URL] FILE...`: checks every rate-limit filter config
//! in each file with the filter's own validation, and with `--probe` the live bridge at URL with
//! each config's credentials. Exit status: 0 all valid (and the bridge ready); 1 a config is
//! invalid, or a file holds none (with `--allow-none`: the files all together hold none), or the
//! bridge refuses a config; 2 a file cannot be read or is neither JSON nor YAML, or a bad
//! argument; 3 the bridge cannot be reached or answers otherwise. The highest applies.

use std::process::ExitCode;

use ratelimit_check::probe::{probe, Found, Target, Verdict};
use ratelimit_check::{find, summary};

const USAGE: &str = "usage: ratelimit-check [--allow-none] [--probe URL] FILE...
Checks every rate-limit filter config in each FILE (the filter's JSON, an Envoy config,
Kubernetes manifests) with the filter's own validation, and prints what each policy does.
  --allow-none  a file may hold no filter config, as long as the files together hold one
                (a set of manifests where only some files carry the config)
  --probe URL   also make the calls the filter makes to the Webdis at URL (http://HOST:PORT)
                with each config's credentials: EVALSHA, SCRIPT LOAD, a decision of every
                limit on keys of the probe's own (no identity's state is touched) and its
                give-back; say what the bridge refuses and which setting to fix
Exit status: 0 all valid (and the bridge ready), 1 an invalid config or a file without one, or
a bridge that refuses a config, 2 an unreadable file or a bad argument, 3 a bridge that cannot
be reached or answers otherwise.";

fn main() -> ExitCode {
    let mut allow_none = false;
    let mut target = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let url = match arg.as_str() {
            "--probe" => Some(args.next().unwrap_or_default()),
            _ => arg.strip_prefix("--probe=").map(str::to_string),
        };
        if let Some(url) = url {
            match Target::parse(&url) {
                Ok(t) => target = Some((url, t)),
                Err(why) => {
                    eprintln!("ratelimit-check: --probe: {why}\n{USAGE}");
                    return ExitCode::from(2);
                }
            }
            continue;
        }
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
        let (status, found) = check_file(file, allow_none, target.as_ref());
        worst = worst.max(status);
        configs += found;
    }
    if allow_none && configs == 0 && worst < 2 {
        eprintln!("no rate-limit filter config in any of the files");
        worst = 1;
    }
    ExitCode::from(worst)
}

/// Checks one file and prints its findings (with `target`, what the bridge there answers each
/// config); returns its exit status and how many configs it holds.
fn check_file(file: &str, allow_none: bool, target: Option<&(String, Target)>) -> (u8, usize) {
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
            Ok(parsed) => {
                print!("{place}: OK\n{}", summary(parsed));
                if let Some((url, target)) = target {
                    status = status.max(probe_config(&place, parsed, url, target));
                }
            }
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

/// Probes the bridge at `target` (`url`) with one config and prints what it found; returns
/// the exit status it makes.
fn probe_config(place: &str, config: &ratelimit_core::Config, url: &str, target: &Target) -> u8 {
    let mut lines = String::new();
    let Found { verdict, causes } = probe(config, target, &mut lines);
    print!("{place}: probing the bridge at {url}\n{lines}");
    let causes: Vec<&str> = causes.iter().map(|c| c.name()).collect();
    match verdict {
        Verdict::Ready => {
            println!("{place}: the bridge at {url} answers every call of this config");
            0
        }
        Verdict::Refused => {
            eprintln!(
                "{place}: the bridge at {url} refuses this config ({}): no request it refuses would be decided (each would follow its failure policy); fix the setting named above",
                causes.join(", ")
            );
            1
        }
        Verdict::Failing => {
            eprintln!(
                "{place}: the bridge at {url} did not answer as the filter needs (see above)"
            );
            3
        }
    }
}
