//! A minimal Redis client (RESP2) for test set-up and inspection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) | Resp::Error(s) => s.clone(),
            Resp::Int(i) => i.to_string(),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            Resp::Bulk(None) | Resp::Array(None) => "(nil)".into(),
            Resp::Array(Some(items)) => {
                let parts: Vec<String> = items.iter().map(Resp::text).collect();
                format!("[{}]", parts.join(", "))
            }
        }
    }

    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            other => panic!("expected an integer, got {other:?}"),
        }
    }

    pub fn items(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(items)) => items.clone(),
            other => panic!("expected an array, got {other:?}"),
        }
    }
}

pub struct RedisConn {
    reader: BufReader<TcpStream>,
}

impl RedisConn {
    pub fn connect(port: u16) -> std::io::Result<RedisConn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(RedisConn {
            reader: BufReader::new(stream),
        })
    }

    /// Connects and authenticates as `user`.
    pub fn login(port: u16, user: &str, password: &str) -> std::io::Result<RedisConn> {
        let mut conn = RedisConn::connect(port)?;
        match conn.cmd(&["AUTH", user, password])? {
            Resp::Simple(_) => Ok(conn),
            other => Err(std::io::Error::other(format!("AUTH failed: {other:?}"))),
        }
    }

    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Resp> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            let arg = arg.as_ref();
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&out)?;
        self.read()
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let line = line.trim_end_matches("\r\n");
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad RESP");
        let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
        Ok(match kind {
            "+" => Resp::Simple(rest.to_string()),
            "-" => Resp::Error(rest.to_string()),
            ":" => Resp::Int(rest.parse().map_err(|_| bad())?),
            "$" => {
                let len: i64 = rest.parse().map_err(|_| bad())?;
                if len < 0 {
                    Resp::Bulk(None)
                } else {
                    let mut buf = vec![0; len as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(len as usize);
                    Resp::Bulk(Some(buf))
                }
            }
            "*" => {
                let len: i64 = rest.parse().map_err(|_| bad())?;
                if len < 0 {
                    Resp::Array(None)
                } else {
                    let mut items = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        items.push(self.read()?);
                    }
                    Resp::Array(Some(items))
                }
            }
            _ => return Err(bad()),
        })
    }
}
