//! The `/metrics` and `/leader` endpoints: hyper, one task per connection, bounded.

use std::net::SocketAddr;
use std::time::Duration;
use tracing::Instrument;

use anyhow::Result;

use super::leader::leader;
use super::refusals::create_check_file;
use super::render;

/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 32;
/// A client that has not sent its request headers by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the accept loop waits after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// A connection's whole life, whatever it does: a client that sends requests but never reads
/// the answers would otherwise keep its slot for as long as it likes. A scrape takes
/// milliseconds, and an idle keep-alive connection is closed after `HEADER_TIMEOUT` anyway.
const CONNECTION_LIFE: Duration = Duration::from_secs(10);

/// Binds now (so a bad address fails at start-up) and serves in the background, with hyper,
/// on a thread and runtime of its own.
///
/// Each connection is a task of its own, so a slow or abusive client holds only that task;
/// headers must arrive within 5 s, a connection lives at most 10 s, and at most 32
/// connections are served at once. The thread is what keeps the lease's renewals out of
/// reach: on the run's runtime, 32 clients that pipeline requests and never read the answers
/// kept it busy rendering for long enough that a renewal came too late, and the term was
/// lost (on a loaded 2-core machine, with a debug build). Returns the file the jobs'
/// `lead-exec check` counts its refusals in, if it could be made (see `metrics::refusals`).
pub fn serve(addr: SocketAddr) -> Result<Option<std::path::PathBuf>> {
    let refusals = create_check_file()
        .inspect_err(|e| tracing::warn!("cannot count the job's `lead-exec check` refusals: {e}"))
        .ok();
    // A taken port or a foreign address is a setting to fix, not an internal error.
    let cannot_listen = |e: std::io::Error| {
        crate::exit::fail(
            crate::exit::Exit::Usage,
            format!("--metrics-addr {addr}: cannot listen: {e}"),
        )
    };
    let listener = std::net::TcpListener::bind(addr).map_err(cannot_listen)?;
    listener.set_nonblocking(true).map_err(cannot_listen)?;
    if let Ok(bound) = listener.local_addr() {
        tracing::info!("metrics at http://{bound}/metrics, the leader check at /leader");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || rt.block_on(accept(listener).instrument(span)))?;
    Ok(refusals)
}

/// The accept loop, for as long as the process lives.
async fn accept(listener: std::net::TcpListener) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("metrics endpoint off: {e}");
            return;
        }
    };
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(_) => {
                // Out of descriptors (EMFILE), say: they come back only when connections
                // close, and an accept tried again at once fails again at once, a core
                // spinning until then.
                drop(permit);
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(sock),
                    hyper::service::service_fn(answer),
                );
            let _ = tokio::time::timeout(CONNECTION_LIFE, conn).await;
            drop(permit);
        });
    }
}

type Body = http_body_util::Full<hyper::body::Bytes>;

/// `GET` or `HEAD /metrics` and `/leader`; 404 elsewhere, 405 for other methods.
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
    use hyper::{Method, StatusCode};
    let reply = |status: StatusCode, body: String| {
        let mut r = hyper::Response::new(Body::new(body.into()));
        *r.status_mut() = status;
        r
    };
    let read = matches!(req.method(), &Method::GET | &Method::HEAD);
    let mut resp = match req.uri().path() {
        "/metrics" | "/leader" if !read => {
            let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n".into());
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
        "/metrics" => {
            let mut r = reply(StatusCode::OK, render());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        "/leader" => {
            let (leads, body) = leader();
            let status = if leads {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let mut r = reply(status, body);
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            // A health check must see the term as it is now, never a cached answer.
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /leader\n".into(),
        ),
    };
    if req.method() == Method::HEAD {
        // hyper sends no body for HEAD; keep the length a GET would have.
        let len = hyper::body::Body::size_hint(resp.body())
            .exact()
            .unwrap_or(0);
        resp.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    Ok(resp)
}
