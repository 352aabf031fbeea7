//! A threaded TCP server on a free loopback port, for the harness's stand-ins written in Rust
//! (the OpenAI-compatible upstream, the authorization service, the application): a thread per
//! connection; dropped, it stops accepting, shuts every open connection down and joins every
//! thread, so a test leaves nothing running.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What a [`Server`] runs for each connection.
pub trait Service: Send + Sync + 'static {
    /// Set when the server stops: a long answer checks it to end early.
    fn stop_flag(&self) -> &AtomicBool;
    /// Answers one connection; an error (a connection that broke) ends its thread quietly.
    fn serve(&self, stream: TcpStream) -> std::io::Result<()>;
}

/// The connections being served, to shut them down and join their threads.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub struct Server<S: Service> {
    pub port: u16,
    pub service: Arc<S>,
    connections: Arc<Connections>,
    accept: Option<JoinHandle<()>>,
}

impl<S: Service> Server<S> {
    /// Starts `service` on a free loopback port (`what` names it in a panic); it accepts
    /// connections when this returns.
    pub fn start(what: &str, service: S) -> Server<S> {
        let (listener, port) = bind_free(what);
        let service = Arc::new(service);
        let connections = Arc::new(Connections::default());
        let (s, c) = (service.clone(), connections.clone());
        let accept = std::thread::spawn(move || accept_loop(listener, s, c));
        Server {
            port,
            service,
            connections,
            accept: Some(accept),
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        lock(&self.connections.open).len()
    }
}

impl<S: Service> Drop for Server<S> {
    fn drop(&mut self) {
        self.service.stop_flag().store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for conn in lock(&self.connections.open).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.connections.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// The guard of `mutex`, also when a thread panicked holding it (a test's assertion).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A listener on a free loopback port (another process may take the port `free_port` found
/// before the bind: then another one).
fn bind_free(what: &str) -> (TcpListener, u16) {
    for _ in 0..20 {
        let port = crate::free_port();
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return (listener, port);
        }
    }
    panic!("no free loopback port for {what}");
}

fn accept_loop<S: Service>(listener: TcpListener, service: Arc<S>, connections: Arc<Connections>) {
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if service.stop_flag().load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        next_id += 1;
        let id = next_id;
        lock(&connections.open).insert(id, clone);
        let (s, c) = (service.clone(), connections.clone());
        let thread = std::thread::spawn(move || {
            // A connection that breaks ends its thread: nothing to report.
            let _ = s.serve(stream);
            lock(&c.open).remove(&id);
        });
        let mut threads = lock(&connections.threads);
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
    }
}

/// One HTTP/1.1 request of a keep-alive connection, as the simple stand-ins read it: its
/// request line, its headers (names lower-cased) and its body by `content-length`.
pub struct SimpleRequest {
    pub line: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl SimpleRequest {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The request's target (`/path?query`).
    pub fn target(&self) -> &str {
        self.line.split_whitespace().nth(1).unwrap_or("")
    }

    /// The client asked to close the connection after the answer.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A request's header lines up to the empty one, names lower-cased; a connection closed
/// before it is an error.
pub fn read_headers(reader: &mut impl BufRead) -> std::io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "connection closed in the headers",
            ));
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Ok(headers);
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
}

/// The next request off `reader`; None once the peer closed the connection or `stop` is set.
/// A body over `max_body` bytes, or a connection closed inside the head, is an error.
pub fn read_simple_request(
    reader: &mut BufReader<TcpStream>,
    stop: &AtomicBool,
    max_body: usize,
) -> std::io::Result<Option<SimpleRequest>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 || stop.load(Ordering::SeqCst) {
        return Ok(None);
    }
    let mut request = SimpleRequest {
        line: line.trim_end().to_string(),
        headers: read_headers(reader)?,
        body: Vec::new(),
    };
    let length: usize = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if length > max_body {
        return Err(bad("request body too large"));
    }
    request.body = vec![0; length];
    reader.read_exact(&mut request.body)?;
    Ok(Some(request))
}
