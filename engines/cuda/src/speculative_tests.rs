use super::*;

#[test]
fn lookup_continues_the_latest_earlier_occurrence() {
    // "a b c d a b" -> after "a b" came "c d a b"; the latest "a b" before the tail.
    let text = [1, 2, 3, 4, 1, 2];
    assert_eq!(prompt_lookup(&text, 3, 1, 3), (vec![3, 4, 1], 2));
    assert_eq!(prompt_lookup(&text, 10, 1, 3), (vec![3, 4, 1, 2], 2));
    // The longest n-gram wins over a later, shorter match.
    let text = [7, 8, 9, 5, 8, 9, 6, 7, 8, 9];
    assert_eq!(prompt_lookup(&text, 2, 1, 3), (vec![5, 8], 3));
    assert_eq!(prompt_lookup(&text, 2, 1, 2), (vec![6, 7], 2));
    // Nothing repeats, or n-grams longer than the text.
    assert_eq!(prompt_lookup(&[1, 2, 3, 4], 4, 1, 3), (vec![], 0));
    assert_eq!(prompt_lookup(&[1, 2], 4, 2, 3), (vec![], 0));
    assert_eq!(prompt_lookup(&[], 4, 1, 3), (vec![], 0));
    assert_eq!(prompt_lookup(&[1, 1, 1], 0, 1, 3), (vec![], 0));
    // A run of one token drafts more of it.
    assert_eq!(prompt_lookup(&[5, 5, 5, 5], 2, 2, 3), (vec![5], 3));
}

#[test]
fn a_match_of_the_longest_ngram_drafts_in_full() {
    // "1 2 3 4 5 6 7 | 1 2 3": a 3-gram match drafts all four, whatever the adapted length.
    let copied = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3];
    assert_eq!(lookup_drafts(&copied, 1, 4, 2, 3), vec![4, 5, 6, 7]);
    assert_eq!(lookup_drafts(&copied, 0, 4, 2, 3), vec![4, 5, 6, 7]);
    // "9 2 3 4 5 6 7 | 1 2 3" ends in a 2-gram match only: the adapted length holds.
    let shorter = [9, 2, 3, 4, 5, 6, 7, 1, 2, 3];
    assert_eq!(lookup_drafts(&shorter, 1, 4, 2, 3), vec![4]);
    assert!(lookup_drafts(&shorter, 0, 4, 2, 3).is_empty());
}

#[test]
fn a_full_draft_kept_whole_drafts_the_copying_length_next() {
    let mut length = DraftLength::new(4).copying(7);
    assert_eq!(length.full(), 4, "not copying before a draft was kept");
    length.record(4, 4);
    assert_eq!(length.full(), 7, "a full draft kept whole: copying");
    length.record(7, 7);
    assert_eq!(length.full(), 7);
    length.record(7, 5);
    assert_eq!(length.full(), 4, "a rejection ends the copying");
    length.record(2, 2);
    assert_eq!(length.full(), 4, "a short draft kept whole is not copying");
    // Never under the usual most nor over MAX_DRAFT; a fixed length never copies.
    assert_eq!(DraftLength::new(4).copying(2).copy, 4);
    assert_eq!(DraftLength::new(4).copying(99).copy, MAX_DRAFT);
    let mut fixed = DraftLength::fixed(3);
    fixed.record(3, 3);
    assert_eq!(fixed.full(), 3);
    // The copying length reaches lookup: a longest-n-gram match drafts that many.
    let copied = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3];
    assert_eq!(
        lookup_drafts(&copied, 4, 7, 2, 3),
        vec![4, 5, 6, 7, 8, 9, 10]
    );
}

#[test]
fn draft_length_follows_acceptance_and_pauses_when_drafts_fail() {
    let mut length = DraftLength::new(4);
    assert_eq!(length.take(), 4);
    length.record(4, 4);
    assert_eq!(length.take(), 4);
    length.record(4, 1);
    let shorter = length.take();
    assert!((1..4).contains(&shorter), "{shorter}");
    while length.paused == 0 {
        length.record(2, 0);
    }
    let paused = (0..).take_while(|_| length.take() == 0).count();
    assert_eq!(paused, PAUSE_STEPS as usize);
    // The step that ended the count drafted: one token after a pause.
    let mut length = DraftLength {
        paused: 0,
        ..length
    };
    assert_eq!(length.take(), 1, "one token after a pause");
    length.record(0, 0);
    assert_eq!(length.take(), 1, "a step without drafts changes nothing");
    // A retry that fails pauses twice as long; one that is kept ends the backing off.
    length.record(1, 0);
    let paused = (0..).take_while(|_| length.take() == 0).count();
    assert_eq!(paused, 2 * PAUSE_STEPS as usize);
    length.record(1, 1);
    while length.paused == 0 {
        length.record(1, 0);
    }
    let paused = (0..).take_while(|_| length.take() == 0).count();
    assert_eq!(paused, PAUSE_STEPS as usize);
}

#[test]
fn a_costly_draft_pauses_at_the_acceptance_that_pays_for_it() {
    // Half the drafts kept: worth it when drafts are free, not at 0.6 of a step each.
    let mut free = DraftLength::new(4);
    let mut costly = DraftLength::new(4).costing(0.6);
    for _ in 0..8 {
        free.record(2, 1);
        costly.record(2, 1);
    }
    assert!(free.take() > 0);
    assert_eq!(costly.take(), 0);
    // The model drafting for itself (cost 1) still drafts while it is nearly always right.
    // A model whose drafts have not paid starts new sequences paused for long.
    assert!(!DraftLength::pays(0.6, 0.5) && DraftLength::pays(0.0, 0.5));
    let mut doubtful = DraftLength::new(4).costing(0.6).doubtful();
    let paused = (0..).take_while(|_| doubtful.take() == 0).count();
    assert_eq!(paused, (PAUSE_STEPS << MAX_BACKOFF) as usize);
    let mut itself = DraftLength::new(4).costing(1.0);
    for _ in 0..8 {
        itself.record(4, 4);
    }
    itself.record(6, 5);
    assert!(itself.take() > 0);
}

#[test]
fn a_fixed_length_never_adapts() {
    let mut length = DraftLength::fixed(3);
    for _ in 0..10 {
        assert_eq!(length.take(), 3);
        length.record(3, 0);
    }
    assert_eq!(DraftLength::fixed(99).take(), MAX_DRAFT);
}

#[test]
fn settings_bound_the_ngrams_and_the_draft() {
    assert!(SpeculativeSettings::default().validate().is_ok());
    let bad = SpeculativeSettings {
        min_ngram: 0,
        ..SpeculativeSettings::default()
    };
    assert!(bad.validate().is_err());
    let bad = SpeculativeSettings {
        min_ngram: 4,
        max_ngram: 3,
        ..SpeculativeSettings::default()
    };
    assert!(bad.validate().is_err());
    let bad = SpeculativeSettings {
        tokens: MAX_DRAFT + 1,
        ..SpeculativeSettings::default()
    };
    assert!(bad.validate().is_err());
    let bad = SpeculativeSettings {
        copy_tokens: MAX_DRAFT + 1,
        ..SpeculativeSettings::default()
    };
    assert!(bad.validate().unwrap_err().contains("copy_tokens"));
    let bad = SpeculativeSettings {
        draft_layers: Some(0),
        ..SpeculativeSettings::default()
    };
    assert!(bad.validate().is_err());
    // A confidence needs a draft model, and must be a probability.
    let lookup = SpeculativeSettings {
        confidence: Some(0.5),
        ..SpeculativeSettings::default()
    };
    assert!(lookup.validate().is_err());
    let model = SpeculativeSettings {
        draft_layers: Some(4),
        confidence: Some(0.5),
        ..SpeculativeSettings::default()
    };
    assert!(model.validate().is_ok() && model.uses_model());
    let bad = SpeculativeSettings {
        confidence: Some(1.5),
        ..model
    };
    assert!(bad.validate().is_err());
}
