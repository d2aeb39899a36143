use super::*;
use crate::apiserver::audit::Level;

/// Keeps what it is given; fails while `failing`, and can be held up.
#[derive(Default)]
struct Recorder {
    batches: parking_lot::Mutex<Vec<Vec<Event>>>,
    failing: std::sync::atomic::AtomicBool,
    hold: parking_lot::Mutex<()>,
}

impl Backend for Arc<Recorder> {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn process(&self, events: &[Event]) -> bool {
        let _held = self.hold.lock();
        self.batches.lock().push(events.to_vec());
        !self.failing.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn event(level: Level, object_bytes: usize) -> Event {
    let mut req = axum::extract::Request::get("/apis/demo.k8s.io/v1beta1/namespaces/ns/podsets")
        .body(axum::body::Body::empty())
        .unwrap();
    let mut ev = Event::of_request(&mut req, level);
    if object_bytes > 0 {
        let v = serde_json::json!({"data": "x".repeat(object_bytes)});
        ev.request_object = serde_json::value::to_raw_value(&v).ok();
    }
    ev
}

fn errors(plugin: &str) -> u64 {
    metrics().errors.get_or_create(&PluginLabel { plugin: plugin.into() }).get()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn modes_fail_a_request_only_when_strict() {
    let rec = Arc::new(Recorder::default());
    rec.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let batch = BatchConfig { buffer_size: 10, max_batch_size: 1, max_batch_wait: Duration::ZERO, throttle: None };
    let strict = wrap(Arc::new(rec.clone()), Mode::BlockingStrict, &batch, None);
    let blocking = wrap(Arc::new(rec.clone()), Mode::Blocking, &batch, None);
    assert!(!strict.process(&[event(Level::Metadata, 0)]));
    assert!(blocking.process(&[event(Level::Metadata, 0)]));
    assert_eq!(rec.batches.lock().len(), 2, "both wrote synchronously");
}

#[test]
fn batches_fill_up_to_their_size_and_a_full_queue_drops_and_counts() {
    let rec = Arc::new(Recorder::default());
    let cfg =
        BatchConfig { buffer_size: 3, max_batch_size: 2, max_batch_wait: Duration::from_millis(50), throttle: None };
    let buffered = Buffered::start(Arc::new(rec.clone()), cfg);
    let before = errors("buffered");
    {
        // The writer takes the first event and then waits on the held delegate; the queue (3) fills behind it.
        let _hold = rec.hold.lock();
        for _ in 0..10 {
            assert!(buffered.process(&[event(Level::Metadata, 0)]), "never fails the request");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let written = || rec.batches.lock().iter().map(Vec::len).sum::<usize>() as u64;
    // Other tests may drop events too: the count is at least ours.
    wait_for("each event written or counted as dropped", || written() + (errors("buffered") - before) >= 10);
    let dropped = 10 - written();
    assert!(dropped >= 5, "at most the queue (3) and one batch (2) were taken: {dropped} dropped");
    assert!(errors("buffered") - before >= dropped);
    assert!(rec.batches.lock().iter().all(|b| b.len() <= 2), "batches of at most 2");
}

#[test]
fn truncation_drops_objects_then_events_and_splits_batches() {
    let rec = Arc::new(Recorder::default());
    let events = [
        event(Level::Request, 10),
        event(Level::Request, 5000),
        event(Level::Metadata, 5000),
        event(Level::Request, 10),
    ];
    let mut cut = events[1].clone();
    cut.request_object = None;
    cut.annotations.insert(TRUNCATED.into(), "true".into());
    // The first two fit a batch exactly; the last needs another.
    let cfg = TruncateConfig { max_event_size: 2000, max_batch_size: size_of(&events[0]) + size_of(&cut) };
    let truncate = Truncate { delegate: Arc::new(rec.clone()), cfg };
    let before = errors("truncate");
    assert!(truncate.process(&events));
    let batches = rec.batches.lock().clone();
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [2, 1], "three events kept, split to stay within a batch's bytes");
    let cut = &batches[0][1];
    assert!(cut.request_object.is_none());
    assert_eq!(cut.annotations.get(TRUNCATED).map(String::as_str), Some("true"));
    assert!(batches[0][0].request_object.is_some() && !batches[0][0].annotations.contains_key(TRUNCATED));
    assert_eq!(errors("truncate") - before, 1, "the Metadata event has nothing to cut: dropped");
}

#[test]
fn the_token_bucket_spaces_batches_beyond_the_burst() {
    let mut b = TokenBucket::new(50.0, 2);
    let start = Instant::now();
    for _ in 0..4 {
        b.take();
    }
    // Two from the burst, two at 50 a second.
    assert!(start.elapsed() >= Duration::from_millis(35), "{:?}", start.elapsed());
}
