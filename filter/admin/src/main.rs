//! `ratelimit-admin`: see `USAGE` and docs/admin.md. Exit status: 0 done, 1 failed, 2 a bad
//! command line.

use std::process::ExitCode;

use ratelimit_admin::{operator, parse, run, Command, USAGE};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = match parse(&args, |name| std::env::var(name).ok()) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("ratelimit-admin: {e}\n(ratelimit-admin --help lists the commands)");
            return ExitCode::from(e.exit_status());
        }
    };
    if cli.command == Command::Help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&cli, operator::os_user(|name| std::env::var(name).ok())) {
        Ok(report) => {
            if cli.json {
                println!("{}", report.json);
            } else {
                print!("{}", report.human);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ratelimit-admin: {e}");
            ExitCode::from(e.exit_status())
        }
    }
}
