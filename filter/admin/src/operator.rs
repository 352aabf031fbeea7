//! Who makes a change, when `--by` does not say: the OS user running the command. The audit
//! stream is only worth reading if each entry names someone, so an unnamed change is refused
//! rather than recorded as nobody.

/// The name of the user running this process: its real uid's entry in /etc/passwd (Linux's
/// /proc gives the uid), else `$LOGNAME`, else `$USER` (a uid with no entry there, such as a
/// container's, or a system without /proc). None when none of them names one.
pub fn os_user(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    named(read("/proc/self/status"), read("/etc/passwd"), env)
}

/// [`os_user`] from the texts of /proc/self/status and /etc/passwd, if they could be read.
pub fn named(
    status: Option<String>,
    passwd: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let from_passwd = status
        .and_then(|status| real_uid(&status))
        .and_then(|uid| user_name(&passwd?, uid));
    let nonempty = |name: &String| !name.trim().is_empty();
    from_passwd
        .or_else(|| env("LOGNAME").filter(nonempty))
        .or_else(|| env("USER").filter(nonempty))
}

/// The real uid in the text of /proc/self/status (`Uid:` real, effective, saved, filesystem).
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|id| id.parse().ok())
}

/// The name of `uid`'s first entry in the text of /etc/passwd (`name:password:uid:...`).
pub fn user_name(passwd: &str, uid: u32) -> Option<String> {
    passwd
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?;
            (id.parse() == Ok(uid) && !name.is_empty()).then(|| name.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_uid_is_the_first_of_the_uid_line() {
        let status = "Name:\tratelimit-admin\nUmask:\t0022\nState:\tR (running)\n\
                      Uid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(real_uid(status), Some(1000));
        assert_eq!(real_uid("Name:\tx\nGid:\t1\t1\t1\t1\n"), None);
        assert_eq!(real_uid("Uid:\tnobody\n"), None);
    }

    #[test]
    fn a_uid_is_named_by_its_first_passwd_entry() {
        let passwd = "# users\nroot:x:0:0:root:/root:/bin/bash\n\
                      ana:x:1000:1000:Ana,,,:/home/ana:/bin/bash\n\
                      ana2:x:1000:1000::/home/ana2:/bin/sh\n\
                      broken:x\n:x:1001:1001::/:/bin/sh\n";
        assert_eq!(user_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(user_name(passwd, 1000).as_deref(), Some("ana"));
        // No entry, or one without a name: not named.
        assert_eq!(user_name(passwd, 1001), None);
        assert_eq!(user_name(passwd, 4242), None);
        assert_eq!(user_name("", 0), None);
    }

    #[test]
    fn the_uids_name_comes_first_then_logname_then_user() {
        let status = || Some("Uid:\t1000\t1000\t1000\t1000\n".to_string());
        let passwd = || Some("ana:x:1000:1000::/home/ana:/bin/sh\n".to_string());
        let env = |logname: &'static str, user: &'static str| {
            move |name: &str| match name {
                "LOGNAME" => Some(logname.to_string()),
                "USER" => Some(user.to_string()),
                _ => None,
            }
        };
        let unset = |_: &str| None;
        assert_eq!(
            named(status(), passwd(), env("bo", "cy")).as_deref(),
            Some("ana")
        );
        assert_eq!(named(status(), passwd(), unset).as_deref(), Some("ana"));
        // A uid /etc/passwd does not name (a container's), or no /proc: the environment.
        let stranger = Some("Uid:\t4242\t4242\t4242\t4242\n".to_string());
        assert_eq!(
            named(stranger.clone(), passwd(), env("bo", "cy")).as_deref(),
            Some("bo")
        );
        assert_eq!(named(None, passwd(), env("", "cy")).as_deref(), Some("cy"));
        assert_eq!(named(status(), None, env(" ", "cy")).as_deref(), Some("cy"));
        // Nothing names one.
        assert_eq!(named(stranger, passwd(), env("", "")), None);
        assert_eq!(named(None, None, unset), None);
    }
}
