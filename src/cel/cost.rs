//! Runtime cost, as k8s.io/apiserver bounds it (`celconfig.PerCallLimit`, `RuntimeCELCostBudget`): every
//! evaluation is charged its expression's size once, and each comprehension step the size of what the step
//! evaluates, so nested macros over large lists stop at the limit instead of holding the request.
//!
//! The interpreter has no hook of its own: compilation rewrites each comprehension's loop condition into a call of
//! [`TICK`] (see `check.rs`), which charges the meter of the evaluation running on this thread. Evaluation is
//! synchronous, so a thread-local meter is exact.

use std::cell::Cell;

use kube_cel::cel::objects::Value;
use kube_cel::cel::ExecutionError;

/// The function a rewritten comprehension calls once per step: `@tick(<cost>, <loop condition>)`.
pub(crate) const TICK: &str = "@podset.tick";

/// How much one expression may cost (k8s.io/apiserver `celconfig.PerCallLimit`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;

/// How much all the expressions of one policy may cost for one request (`celconfig.RuntimeCELCostBudget`).
pub const RUNTIME_BUDGET: u64 = 10_000_000;

/// kube's message when an expression goes over its limit.
pub const LIMIT_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

#[derive(Clone, Copy, Default)]
struct Meter {
    used: u64,
    limit: u64,
    exceeded: bool,
}

thread_local! {
    static METER: Cell<Option<Meter>> = const { Cell::new(None) };
}

/// Runs `f` with a fresh meter allowing `limit`, or inside the meter already running (an expression evaluated
/// from another, a variable). Returns what it cost and whether the limit was hit.
pub(crate) fn metered<T>(limit: u64, f: impl FnOnce() -> T) -> (T, u64, bool) {
    if METER.with(|m| m.get().is_some()) {
        let before = METER.with(|m| m.get().map_or(0, |m| m.used));
        let out = f();
        let after = METER.with(|m| m.get().unwrap_or_default());
        return (out, after.used.saturating_sub(before), after.exceeded);
    }
    METER.with(|m| m.set(Some(Meter { used: 0, limit, exceeded: false })));
    // Reset even when `f` unwinds, so a panic caught further up leaves no meter behind.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            METER.with(|m| m.set(None));
        }
    }
    let reset = Reset;
    let out = f();
    let meter = METER.with(|m| m.get().unwrap_or_default());
    drop(reset);
    (out, meter.used, meter.exceeded)
}

/// Charges `cost` to the running meter; an error once it is over its limit.
pub(crate) fn charge(cost: u64) -> Result<(), ExecutionError> {
    METER.with(|m| {
        let Some(mut meter) = m.get() else { return Ok(()) };
        meter.used = meter.used.saturating_add(cost);
        let over = meter.used > meter.limit;
        meter.exceeded |= over;
        m.set(Some(meter));
        if over {
            Err(ExecutionError::function_error("cost", LIMIT_EXCEEDED))
        } else {
            Ok(())
        }
    })
}

/// `@tick(cost, condition)`: charges `cost`, then hands the loop condition back.
pub(crate) fn tick(cost: i64, condition: Value) -> Result<Value, ExecutionError> {
    charge(u64::try_from(cost).unwrap_or(0))?;
    Ok(condition)
}
