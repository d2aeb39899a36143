//! The Pod sandbox's process, as Kubernetes' pause: holds the Pod's namespaces, exits on SIGINT/SIGTERM, and
//! reaps orphans when the Pod shares one PID namespace.

extern "C" fn terminate(_: i32) {
    podset_node_images::exit_now(0);
}

extern "C" fn child_exited(_: i32) {
    podset_node_images::reap_children();
}

fn main() {
    if std::process::id() != 1 {
        eprintln!("pause: warning: not PID 1");
    }
    podset_node_images::on_terminate(terminate);
    podset_node_images::on_child_exit(child_exited);
    loop {
        podset_node_images::wait_for_signal();
    }
}
