//! A small workload for the local node's Pods (the README's PodSet example runs it):
//!
//!   podset-demo [--port 8080] [--ready-after SECONDS] [--exit-after SECONDS] [--exit-code N]
//!
//! - `GET /healthz`: 200 while it runs (a liveness probe's target).
//! - `GET /readyz`: 503 until `--ready-after` has passed, then 200 (a readiness probe's target).
//! - `GET /unready`: answers, then `/readyz` is 503 from then on: a running Pod its probe makes unready.
//! - `GET /exit?code=N`: answers, then exits with N (default 0): a container that ends when a test says so.
//! - `--exit-after`: exits with `--exit-code` (default 0) that many seconds after start, untold.
//!
//! SIGTERM ends it at once with status 0, so a deleted Pod goes without waiting out its grace period.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

extern "C" fn terminate(_: i32) {
    podset_node_images::exit_now(0);
}

struct Args {
    port: u16,
    ready_after: Duration,
    exit_after: Option<Duration>,
    exit_code: i32,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { port: 8080, ready_after: Duration::ZERO, exit_after: None, exit_code: 0 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (flag.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next()).ok_or(format!("{name} needs a value"));
        let seconds = |v: String| v.parse::<f64>().map(Duration::from_secs_f64).map_err(|e| format!("{name}: {e}"));
        match name.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--ready-after" => args.ready_after = seconds(value()?)?,
            "--exit-after" => args.exit_after = Some(seconds(value()?)?),
            "--exit-code" => args.exit_code = value()?.parse().map_err(|e| format!("--exit-code: {e}"))?,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "podset-demo: {e}\nusage: podset-demo [--port 8080] [--ready-after S] [--exit-after S] [--exit-code N]"
            );
            std::process::exit(2);
        }
    };
    podset_node_images::on_terminate(terminate);
    let started = Instant::now();
    if let Some(after) = args.exit_after {
        let code = args.exit_code;
        std::thread::spawn(move || {
            std::thread::sleep(after);
            println!("podset-demo: --exit-after {}s: exiting with {code}", after.as_secs_f64());
            std::process::exit(code);
        });
    }
    let listener = TcpListener::bind(("0.0.0.0", args.port)).unwrap_or_else(|e| {
        eprintln!("podset-demo: listening on port {}: {e}", args.port);
        std::process::exit(1);
    });
    println!("podset-demo: serving /healthz, /readyz, /unready and /exit on port {}", args.port);
    let mut told_unready = false;
    for stream in listener.incoming().flatten() {
        let ready = !told_unready && started.elapsed() >= args.ready_after;
        // One request per connection, in turn: probes and tests send a few.
        match serve(stream, ready) {
            Ok(unready) => told_unready |= unready,
            Err(e) => eprintln!("podset-demo: {e}"),
        }
    }
}

/// Answers one request; whether it was `/unready`.
fn serve(stream: TcpStream, ready: bool) -> std::io::Result<bool> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers, unread: nothing here depends on them.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut exit = None;
    let unready = path == "/unready";
    let (status, body) = match path {
        "/healthz" => ("200 OK", "ok".to_owned()),
        "/readyz" if ready => ("200 OK", "ok".to_owned()),
        "/readyz" => ("503 Service Unavailable", "not ready".to_owned()),
        "/unready" => ("200 OK", "not ready from now on".to_owned()),
        "/exit" => {
            let code = query.split('&').find_map(|kv| kv.strip_prefix("code=")).unwrap_or("0");
            match code.parse::<i32>() {
                Ok(code) => {
                    exit = Some(code);
                    ("200 OK", format!("exiting with {code}"))
                }
                Err(_) => ("400 Bad Request", format!("code={code} is not a number")),
            }
        }
        _ => ("404 Not Found", "try /healthz, /readyz, /unready or /exit?code=N".to_owned()),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    if let Some(code) = exit {
        println!("podset-demo: /exit: exiting with {code}");
        std::process::exit(code);
    }
    Ok(unready)
}
