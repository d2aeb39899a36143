//! What the node images' programs share: PID 1 in a container gets no default action for SIGTERM, so without a
//! handler it would wait out the whole grace period and die by SIGKILL. std has no signal API, hence the few libc
//! calls below (std links libc already).

/// Installs `handler` for SIGINT and SIGTERM.
pub fn on_terminate(handler: extern "C" fn(i32)) {
    set_handler(SIGINT, handler);
    set_handler(SIGTERM, handler);
}

/// Installs `handler` for SIGCHLD.
pub fn on_child_exit(handler: extern "C" fn(i32)) {
    set_handler(SIGCHLD, handler);
}

/// Reaps every exited child without blocking.
pub fn reap_children() {
    // SAFETY: waitpid with a null status pointer and WNOHANG only reaps; it touches no memory of ours.
    while unsafe { waitpid(-1, std::ptr::null_mut(), WNOHANG) } > 0 {}
}

/// Sleeps until a signal arrives.
pub fn wait_for_signal() {
    // SAFETY: pause takes no arguments and only blocks.
    unsafe { pause() };
}

/// Exits at once with `code`, from a signal handler too (async-signal-safe, unlike std::process::exit).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process; nothing of ours is left to drop.
    unsafe { _exit(code) }
}

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;
const SIGCHLD: i32 = 17;
const WNOHANG: i32 = 1;

fn set_handler(signal: i32, handler: extern "C" fn(i32)) {
    // SAFETY: the handlers given here call only async-signal-safe functions (_exit, waitpid).
    unsafe { sys_signal(signal, handler) };
}

extern "C" {
    #[link_name = "signal"]
    fn sys_signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn pause() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn _exit(code: i32) -> !;
}
