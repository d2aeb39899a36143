//! A child process of the cluster, its output kept in memory for a failing test.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A child process whose output is kept in memory and printed if the test fails.
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: Arc<Mutex<String>>,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        for stream in
            [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())]
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        Self { name, child, log }
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL, as a crash or a lost node would, and the exit reaped.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
