use super::*;

fn parse(format: ToolCallFormat, pieces: &[&str], max: usize) -> Vec<ToolOutput> {
    let names = vec!["get_weather".to_string(), "get_time".to_string()];
    let mut p = ToolCallParser::new(format, names, max);
    let mut out = Vec::new();
    for piece in pieces {
        p.push(piece, &mut out);
    }
    p.finish(&mut out);
    // Adjacent text pieces read as one.
    let mut merged: Vec<ToolOutput> = Vec::new();
    for o in out {
        match (merged.last_mut(), o) {
            (Some(ToolOutput::Text(a)), ToolOutput::Text(b)) => a.push_str(&b),
            (_, o) => merged.push(o),
        }
    }
    merged
}

fn call(name: &str, arguments: &str) -> ToolOutput {
    ToolOutput::Call(ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    })
}

fn text(s: &str) -> ToolOutput {
    ToolOutput::Text(s.into())
}

#[test]
fn llama3_json_calls_in_every_shape() {
    let f = ToolCallFormat::Llama3Json;
    let one = parse(
        f,
        &[
            " {\"name\": \"get_",
            "weather\", \"parameters\": {\"city\": \"Paris\"}}",
        ],
        8,
    );
    assert_eq!(one, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
    let many = parse(
        f,
        &[r#"{"name":"get_time","arguments":"{\"tz\":\"UTC\"}"}; {"name":"get_weather"}"#],
        8,
    );
    assert_eq!(
        many,
        vec![
            call("get_time", r#"{"tz":"UTC"}"#),
            call("get_weather", "{}")
        ]
    );
    let list = parse(f, &[r#"[{"name":"get_time"},{"name":"get_weather"}]"#], 1);
    assert_eq!(list, vec![call("get_time", "{}")]);
}

#[test]
fn llama3_json_text_and_failures_stay_text() {
    let f = ToolCallFormat::Llama3Json;
    assert_eq!(
        parse(f, &["  Hello", " there"], 8),
        vec![text("  Hello there")]
    );
    let unknown = r#"{"name": "rm_rf", "arguments": {}}"#;
    assert_eq!(parse(f, &[unknown], 8), vec![text(unknown)]);
    let cut = r#"{"name": "get_weather", "argu"#;
    assert_eq!(parse(f, &[cut], 8), vec![text(cut)]);
    assert_eq!(parse(f, &["{\"a\": 1}"], 8), vec![text("{\"a\": 1}")]);
}

#[test]
fn hermes_blocks_split_anywhere() {
    let f = ToolCallFormat::Hermes;
    let whole = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\"}</tool_call>\n";
    let expected = vec![
        text("Let me look.\n"),
        call("get_weather", r#"{"city":"Oslo"}"#),
        call("get_time", "{}"),
    ];
    assert_eq!(parse(f, &[whole], 8), expected);
    let chars: Vec<String> = whole.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(parse(f, &pieces, 8), expected);
    assert_eq!(parse(f, &[whole], 1), expected[..2].to_vec());
}

#[test]
fn hermes_keeps_what_is_not_a_call() {
    let f = ToolCallFormat::Hermes;
    assert_eq!(parse(f, &["a < b <tool"], 8), vec![text("a < b <tool")]);
    let bad = "<tool_call>{not json}</tool_call> after";
    assert_eq!(parse(f, &[bad], 8), vec![text(bad)]);
    let unclosed = "<tool_call>{\"name\": \"get_time\"}";
    assert_eq!(parse(f, &[unclosed], 8), vec![call("get_time", "{}")]);
    let trailing = "<tool_call>{\"name\": \"get_time\"}</tool_call>\n\nDone.";
    assert_eq!(
        parse(f, &[trailing], 8),
        vec![call("get_time", "{}"), text("\n\nDone.")]
    );
    // Whitespace around calls alone is not content; an all-whitespace answer still is.
    let spaced = "\n <tool_call>{\"name\": \"get_time\"}</tool_call>\n";
    assert_eq!(
        parse(f, &["\n ", &spaced[2..]], 8),
        vec![call("get_time", "{}")]
    );
    assert_eq!(parse(f, &["\n", " "], 8), vec![text("\n ")]);
    assert_eq!(parse(f, &["\n", "Hi"], 8), vec![text("\nHi")]);
}

#[test]
fn mistral_calls_in_both_forms() {
    let f = ToolCallFormat::Mistral;
    let list = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]"#;
    let expected = vec![
        call("get_weather", r#"{"city":"Oslo"}"#),
        call("get_time", "{}"),
    ];
    assert_eq!(parse(f, &[list], 8), expected);
    let chars: Vec<String> = list.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(parse(f, &pieces, 8), expected);
    let newer =
        r#"Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{}"#;
    assert_eq!(
        parse(f, &[newer], 1),
        vec![text("Sure. "), call("get_weather", r#"{"city":"Oslo"}"#)]
    );
}

#[test]
fn mistral_keeps_what_is_not_a_call() {
    let f = ToolCallFormat::Mistral;
    assert_eq!(parse(f, &["a [TOOL", "S] b"], 8), vec![text("a [TOOLS] b")]);
    let unknown = r#"[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]"#;
    assert_eq!(parse(f, &[unknown], 8), vec![text(unknown)]);
    let cut = r#"[TOOL_CALLS][{"name": "get_time", "argu"#;
    assert_eq!(parse(f, &[cut], 8), vec![text(cut)]);
}

fn parse_forced(format: ToolCallFormat, text: &str) -> Vec<ToolOutput> {
    let names = vec!["get_weather".to_string(), "get_time".to_string()];
    let mut p = ToolCallParser::new(format, names, usize::MAX).forced();
    let mut out = Vec::new();
    p.push(text, &mut out);
    p.finish(&mut out);
    out
}

#[test]
fn a_forced_call_cut_short_is_still_a_call() {
    let cut = "{\"city\": \"Pa";
    assert_eq!(
        parse_forced(
            ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa"
        ),
        vec![call("get_weather", cut)]
    );
    assert_eq!(
        parse_forced(
            ToolCallFormat::Llama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa"
        ),
        vec![call("get_weather", cut)]
    );
    assert_eq!(
        parse_forced(
            ToolCallFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa"
        ),
        vec![call("get_time", "{}"), call("get_weather", cut)]
    );
    // Cut inside the name: the one offered name it begins.
    assert_eq!(
        parse_forced(ToolCallFormat::Hermes, "<tool_call>\n{\"name\": \"get_w"),
        vec![call("get_weather", "")]
    );
    // Ambiguous, or not begun: text, as before.
    assert_eq!(
        parse_forced(ToolCallFormat::Hermes, "<tool_call>\n{\"name\": \"get_"),
        vec![text("<tool_call>\n{\"name\": \"get_")]
    );
    // Not forced: a cut call stays text.
    assert_eq!(
        parse(
            ToolCallFormat::Hermes,
            &["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {"],
            usize::MAX
        ),
        vec![text(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {"
        )]
    );
}
