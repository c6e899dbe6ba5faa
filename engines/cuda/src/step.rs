//! Where a scheduler's plan becomes a device's batch: the one module that knows both, so
//! neither imports the other (the scheduler plans without a model, a device computes without
//! knowing what was planned or why).

use crate::device::Chunk;
use crate::scheduler::{PlannedChunk, StepPlan};

/// The device's view of a chunk the scheduler planned.
pub fn chunk(planned: &PlannedChunk) -> Chunk<'_> {
    Chunk {
        tokens: &planned.tokens,
        start: planned.start,
        block_table: &planned.block_table,
        logits: planned.sample,
        generated: planned.generated,
        drafts: planned.drafts,
    }
}

/// The block copies of a plan, as (`src`, `dst`) pairs.
pub fn copies(plan: &StepPlan) -> Vec<(u32, u32)> {
    plan.copies.iter().map(|c| (c.src, c.dst)).collect()
}

/// Every chunk of a plan, in the plan's order.
pub fn chunks(plan: &StepPlan) -> Vec<Chunk<'_>> {
    plan.chunks.iter().map(chunk).collect()
}
