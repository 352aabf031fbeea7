//! A threaded TCP server on a free loopback port, for the harness's stand-ins written in Rust
//! (the OpenAI-compatible upstream, the authorization service): a thread per connection;
//! dropped, it stops accepting, shuts every open connection down and joins every thread, so a
//! test leaves nothing running.

use std::collections::HashMap;
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
