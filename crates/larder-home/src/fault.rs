//! Fault injection: a layer that makes chosen operations fail, for tests of what the layers above do
//! when home misbehaves.

use std::sync::Mutex;

use crate::{HomeError, HomeResult, Layer, OpKind};

/// Fails the next `count` operations of a kind with `error`: before they reach home, or (`landed`) after
/// home carried them out, as when the answer is lost.
#[derive(Clone, Debug)]
pub struct Fault {
    pub op: OpKind,
    pub error: HomeError,
    pub count: usize,
    pub landed: bool,
}

/// The layer; rules are consumed in order as matching operations arrive.
#[derive(Default)]
pub struct FaultLayer {
    faults: Mutex<Vec<Fault>>,
}

impl FaultLayer {
    /// Add a rule.
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).push(fault);
    }

    /// Remove every rule.
    pub fn clear(&self) {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl FaultLayer {
    fn take(&self, op: OpKind, landed: bool) -> HomeResult<()> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = faults
            .iter()
            .position(|f| f.op == op && f.count > 0 && f.landed == landed)
        {
            faults[i].count -= 1;
            let error = faults[i].error.clone();
            if faults[i].count == 0 {
                faults.remove(i);
            }
            return Err(error);
        }
        Ok(())
    }
}

impl Layer for FaultLayer {
    fn before(&self, op: OpKind, _bytes_out: u64) -> HomeResult<()> {
        self.take(op, false)
    }
    fn answer(&self, op: OpKind) -> HomeResult<()> {
        self.take(op, true)
    }
}

impl<T: Layer> Layer for std::sync::Arc<T> {
    fn before(&self, op: OpKind, bytes_out: u64) -> HomeResult<()> {
        (**self).before(op, bytes_out)
    }
    fn answer(&self, op: OpKind) -> HomeResult<()> {
        (**self).answer(op)
    }
    fn after(&self, op: OpKind, bytes_in: u64, error: Option<&HomeError>) {
        (**self).after(op, bytes_in, error)
    }
}
