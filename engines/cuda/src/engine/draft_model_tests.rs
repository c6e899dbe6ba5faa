//! The draft model against plain greedy decoding of the same weights, across roll-backs,
//! confidence thresholds and a cache too small for every sequence.

use super::*;
use crate::cpu::{Activations, CpuDevice};
use crate::model::ModelFolder;
use turnpike_tools::model::{MakeOptions, preset, write_model};

const BLOCK: usize = 4;

fn tiny() -> (tempfile::TempDir, ModelFolder) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("tiny");
    let tiny = preset("tiny").unwrap_or_else(|| panic!("no tiny preset"));
    write_model(&tiny, &path, MakeOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let folder = ModelFolder::open(&path).unwrap_or_else(|e| panic!("{e}"));
    (dir, folder)
}

fn device(folder: &ModelFolder, blocks: u32) -> Box<dyn Device> {
    let cpu = CpuDevice::load(folder, blocks, BLOCK as u32, 1, Activations::Exact)
        .unwrap_or_else(|e| panic!("{e}"));
    Box::new(cpu)
}

fn draft_model(folder: &ModelFolder, blocks: u32) -> DraftModel {
    DraftModel::new(
        device(folder, blocks),
        BLOCK,
        folder.spec.vocab_size,
        64,
        folder.spec.max_context,
        1.0,
    )
}

/// `k` tokens of plain greedy decoding after `prompt`, one step per token on a fresh cache.
fn greedy_after(folder: &ModelFolder, prompt: &[u32], k: usize) -> Vec<u32> {
    let mut device = device(folder, 64);
    let table: Vec<u32> = (0..64).collect();
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    let mut out = Vec::new();
    while out.len() < k {
        let chunk = Chunk {
            tokens: &tokens[start..],
            start,
            block_table: &table,
            logits: true,
            generated: start > 0,
            drafts: 0,
        };
        let logits = device
            .forward(&Batch {
                copies: &[],
                chunks: &[chunk],
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let (token, _) = most_likely(&logits).unwrap_or_else(|| panic!("no logits"));
        start = tokens.len();
        tokens.push(token);
        out.push(token);
    }
    out
}

fn ask(seq: SeqId, tokens: &[u32], k: usize) -> DraftAsk<'_> {
    DraftAsk {
        seq,
        tokens,
        k,
        confidence: None,
    }
}

#[test]
fn drafts_are_the_greedy_continuation_across_roll_backs() {
    let (_dir, folder) = tiny();
    let mut model = draft_model(&folder, 64);
    let prompt: Vec<u32> = (0..11).map(|i| 5 + i * 7).collect();
    let first = model
        .draft(&[ask(1, &prompt, 5)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first[0], greedy_after(&folder, &prompt, 5));

    // The target kept two drafts and chose its own third token: the draft model writes the
    // rejected positions again.
    let mut kept = prompt.clone();
    kept.extend_from_slice(&first[0][..2]);
    kept.push((first[0][2] + 1) % 200);
    let second = model
        .draft(&[ask(1, &kept, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second[0], greedy_after(&folder, &kept, 4));

    // Every draft kept, and a sequence drafting for the first time beside it: one batch.
    let mut all = kept.clone();
    all.extend_from_slice(&second[0]);
    all.push(9);
    let other: Vec<u32> = (0..6).map(|i| 40 + i).collect();
    let both = model
        .draft(&[ask(1, &all, 3), ask(2, &other, 6)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(both[0], greedy_after(&folder, &all, 3));
    assert_eq!(both[1], greedy_after(&folder, &other, 6));
    let (used, total, seqs) = model.usage();
    assert_eq!((seqs, total), (2, 64));
    assert!(used >= all.len().div_ceil(BLOCK), "{used}");
    model.forget(1);
    model.forget(2);
    assert_eq!(model.usage(), (0, 64, 0), "forgetting frees every block");
}

#[test]
fn a_confidence_threshold_ends_a_draft_at_the_first_unlikely_token() {
    let (_dir, folder) = tiny();
    let mut model = draft_model(&folder, 64);
    let prompt: Vec<u32> = (0..9).map(|i| 3 + i * 11).collect();
    let sure = |confidence| DraftAsk {
        confidence: Some(confidence),
        ..ask(1, &prompt, 6)
    };
    // Random weights are never certain of a token: a threshold of 1 drafts nothing, a tiny
    // one drafts every token.
    let none = model.draft(&[sure(1.0)]).unwrap_or_else(|e| panic!("{e}"));
    assert!(none[0].is_empty(), "{none:?}");
    let all = model.draft(&[sure(1e-6)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(all[0], greedy_after(&folder, &prompt, 6));
}

#[test]
fn a_full_cache_takes_blocks_from_the_least_recent_sequence_and_never_overflows() {
    let (_dir, folder) = tiny();
    // Six blocks: room for one sequence of 17 tokens drafting 4 (20 positions, 5 blocks).
    let mut model = draft_model(&folder, 6);
    let a: Vec<u32> = (0..17).map(|i| 10 + i).collect();
    let b: Vec<u32> = (0..17).map(|i| 60 + i).collect();
    let drafted = model
        .draft(&[ask(1, &a, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(drafted[0].len(), 4);
    // Sequence 2 needs five blocks: sequence 1 (not drafting now) gives its up.
    let drafted = model
        .draft(&[ask(2, &b, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(drafted[0], greedy_after(&folder, &b, 4));
    assert_eq!(model.usage(), (5, 6, 1));
    // Both at once cannot fit: the one that asked first drafts, the other drafts nothing.
    let drafted = model
        .draft(&[ask(2, &b, 4), ask(1, &a, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(drafted[0].len(), 4);
    assert!(drafted[1].is_empty());
    assert!(model.usage().0 <= 6);
    // A draft past the model's context is not made.
    let mut short = draft_model(&folder, 6);
    short.max_context = 18;
    let drafted = short
        .draft(&[ask(1, &a, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(drafted[0].is_empty());
}
