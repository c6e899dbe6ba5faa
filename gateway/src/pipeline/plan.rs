//! A generation request checked against its model and turned into what the engine runs: the
//! parameters (sampling, stops, log probabilities, grammar, output budget), the prompt token
//! ids (templated and tokenized within the prompt budget), and how to read the output (tool
//! calls, reasoning). One pure step, in one place, before admission.

use std::sync::Arc;
use std::time::Duration;

use turnpike_engine_api::Grammar;

use super::guided::{self, Guided};
use super::request::{GenerationRequest, OutputFormat, ParamNames, Prompt, ToolChoice, Tools};
use super::run::{Job, ToolSetup};
use super::validate::{Expected, OutputCheck, validator};
use super::{params, prompt, tool_grammar};
use crate::engine_host::{Defaults, ServedModel, StructuredOutput};
use crate::error::ApiError;

/// A checked, tokenized generation, before admission.
#[derive(Debug)]
pub(crate) struct Plan {
    /// What to run (its parameters still lack the tenant, set at admission).
    pub job: Job,
    /// Each prompt's text (legacy prompts only; for `echo`).
    pub prompt_texts: Vec<String>,
    /// The scheduling priority (`metadata.priority`).
    pub priority: i32,
}

impl Plan {
    /// Prompt tokens of all prompts.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.job.prompts.iter().map(|p| p.len() as u64).sum()
    }

    /// The most tokens the generation may produce: `max_tokens` for each choice of each prompt.
    pub(crate) fn most_new_tokens(&self) -> u64 {
        let p = &self.job.params;
        u64::from(p.max_tokens) * u64::from(p.n) * self.job.prompts.len() as u64
    }
}

/// Checks `req` against `model` (and the request `defaults`), templates and tokenizes its
/// prompt, and plans request `id` (which the engine also hears); `retry_after` is what an
/// overloaded engine tells the caller.
pub(crate) fn plan(
    req: &GenerationRequest,
    model: &Arc<ServedModel>,
    defaults: &Defaults,
    id: &str,
    retry_after: Duration,
) -> Result<Plan, ApiError> {
    let names = req.names;
    let output = shaping(&req.output, &req.sampling.extensions, names, model)?;
    let (tools, forced_call) = tool_setup(&req.tools, names, model, output.is_some())?;
    let mut p = params::generation_params(&req.sampling, model, defaults)?;
    let stop = params::stop_strings(&req.sampling.stop)?;
    let top = req.top_logprobs.unwrap_or(0);
    if top > 0 && !req.logprobs {
        return Err(ApiError::invalid(
            names.top_logprobs,
            format!("'{}' requires 'logprobs' to be true", names.top_logprobs),
        ));
    }
    let logprobs = params::logprobs(req.logprobs, top, names.top_logprobs, model)?;
    p.logprobs = logprobs.is_some();
    p.top_logprobs = logprobs.unwrap_or(0);
    let shaped_by_format = output.is_some();
    let shape = match (output, forced_call) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                names.tool_choice,
                format!(
                    "a forced tool call and '{}' cannot both shape the output",
                    names.output
                ),
            ));
        }
        (output, forced) => output.or(forced),
    };
    let check = match shape {
        None => None,
        Some(Shaping::Grammar(grammar)) => {
            p.grammar = Some(grammar);
            None
        }
        Some(Shaping::Check(check)) => Some(check),
    };
    if p.beam_width.is_some() && (p.grammar.is_some() || p.top_logprobs > 0) {
        return Err(ApiError::unsupported(
            "best_of",
            format!(
                "beam search ('best_of' above 'n') takes neither a constrained output nor '{}'",
                names.top_logprobs
            ),
        ));
    }
    p.tool_call_grammar = tool_call_grammar(&req.tools, tools.as_ref(), shaped_by_format, model);
    let budget = params::prompt_limit(model, defaults);
    let (prompts, prompt_texts, reasoning) = match &req.prompt {
        Prompt::Chat {
            messages,
            tools: shown,
            template_kwargs,
        } => {
            // With tool_choice "none" the model is not shown the tools.
            let shown = shown
                .as_ref()
                .filter(|_| req.tools.choice != ToolChoice::None);
            let ids = prompt::chat_prompt(
                model,
                messages,
                shown,
                template_kwargs.as_ref(),
                budget,
                names.prompt,
            )?;
            (vec![ids], Vec::new(), model.reasoning.clone())
        }
        Prompt::Texts(value) => {
            params::check_total_choices(prompt::input_count(value), p.n)?;
            let inputs = prompt::text_inputs(value, names.prompt, model, true, budget)?;
            let (ids, texts) = inputs.into_iter().map(|i| (i.ids, i.text)).unzip();
            (ids, texts, None)
        }
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    p.max_tokens = params::max_tokens(
        req.max_tokens,
        names.max_tokens,
        req.default_max_tokens.unwrap_or(defaults.max_output_tokens),
        longest,
        model,
        defaults,
        names.prompt,
    )?;
    params::complete_params(&mut p, model)?;
    p.reasoning_effort = reasoning_effort(req.reasoning_effort.as_deref(), names)?;
    p.request_id = Some(id.to_string());
    let priority = params::priority(req.metadata.as_ref())?;
    p.priority = priority;
    Ok(Plan {
        job: Job {
            model: Arc::clone(model),
            prompts,
            params: p,
            stop,
            logprobs: logprobs.is_some(),
            retry_after,
            tools,
            reasoning,
            check,
        },
        prompt_texts,
        priority,
    })
}

/// Whether and how to parse tool calls (only when tools are offered and the model may call
/// them), and the grammar that forces a call when `tool_choice` asks for one. Offering tools to
/// a model whose tool-call format is not configured is refused (its calls would come back as
/// text nobody parses), as is forcing a call on a model that cannot constrain its output.
fn tool_setup(
    tools: &Tools,
    names: ParamNames,
    model: &ServedModel,
    output_shaped: bool,
) -> Result<(Option<ToolSetup>, Option<Shaping>), ApiError> {
    let forced: Option<Vec<usize>> = match &tools.choice {
        ToolChoice::None => return Ok((None, None)),
        ToolChoice::Auto => None,
        ToolChoice::Required => Some((0..tools.names.len()).collect()),
        ToolChoice::Named(name) => match tools.names.iter().position(|n| n == name) {
            Some(i) => Some(vec![i]),
            None => {
                return Err(ApiError::invalid(
                    names.tool_choice,
                    format!("tool_choice names function `{name}`, which is not among the tools"),
                ));
            }
        },
        ToolChoice::Other => {
            return Err(ApiError::unsupported(
                names.tool_choice,
                "expected 'auto', 'none', 'required' or a function by name",
            ));
        }
    };
    if tools.names.is_empty() {
        if forced.is_some() {
            return Err(ApiError::invalid(
                names.tool_choice,
                "a call is required but no tools are offered",
            ));
        }
        return Ok((None, None));
    }
    let Some(format) = model.tool_call_parser else {
        return Err(ApiError::unsupported(
            "tools",
            format!(
                "model `{}` has no tool-call format configured (`tool_call_parser`), so its tool calls cannot be returned",
                model.id
            ),
        ));
    };
    let setup = ToolSetup {
        format,
        names: tools.names.clone(),
        max_calls: if tools.parallel { usize::MAX } else { 1 },
        forced: forced.is_some(),
    };
    let Some(indices) = forced else {
        return Ok((Some(setup), auto_calls(tools, format, model, output_shaped)));
    };
    let offered: Vec<(&str, &serde_json::Value)> = indices
        .iter()
        .filter_map(|&i| Some((tools.names.get(i)?.as_str(), tools.schemas.get(i)?)))
        .collect();
    if model.info.capabilities.grammar {
        let grammar =
            tool_grammar::forced(format, &offered, tools.parallel, control_id(format, model));
        return Ok((Some(setup), Some(Shaping::Grammar(grammar))));
    }
    if model.structured_output == StructuredOutput::Refuse {
        return Err(ApiError::unsupported(
            names.tool_choice,
            format!(
                "model `{}` cannot be made to call a tool (it cannot constrain its output by a grammar); use 'auto' or 'none'",
                model.id
            ),
        ));
    }
    let mut schemas = std::collections::HashMap::new();
    for (name, schema) in offered {
        schemas.insert(name.to_string(), validator(schema, "tools")?);
    }
    let check = OutputCheck::new(Expected::ToolCall(Arc::new(schemas)), names.tool_choice);
    Ok((Some(setup), Some(Shaping::Check(check))))
}

/// Under `tool_choice: "auto"`, the grammar that holds calls to their schemas once begun, when
/// a function is `strict` and the model can enforce it. Not for reasoning models (their
/// markers may be special tokens a text grammar would ban) nor when `response_format` already
/// shapes the output; non-strict functions' arguments are any object.
fn auto_calls(
    tools: &Tools,
    format: crate::text::tools::ToolCallFormat,
    model: &ServedModel,
    output_shaped: bool,
) -> Option<Shaping> {
    let wanted = tools.strict.iter().any(|&s| s)
        && model.info.capabilities.grammar
        && model.reasoning.is_none()
        && !output_shaped;
    if !wanted {
        return None;
    }
    let any = serde_json::json!({"type": "object"});
    let offered: Vec<(&str, &serde_json::Value)> = tools
        .names
        .iter()
        .zip(&tools.schemas)
        .zip(&tools.strict)
        .map(|((name, schema), &strict)| (name.as_str(), if strict { schema } else { &any }))
        .collect();
    Some(Shaping::Grammar(tool_grammar::auto(
        format,
        &offered,
        tools.parallel,
        control_id(format, model),
    )))
}

/// For an engine that declares it draws tool calls from it (the simulator), the grammar of
/// one call of any offered function, when the model may choose to call them and no output
/// format shapes the answer (a `strict` function's grammar may: a call drawn from this one
/// meets it).
fn tool_call_grammar(
    tools: &Tools,
    setup: Option<&ToolSetup>,
    shaped_by_format: bool,
    model: &ServedModel,
) -> Option<Grammar> {
    let setup = setup?;
    if shaped_by_format
        || tools.choice != ToolChoice::Auto
        || !model.info.capabilities.tool_call_grammar
    {
        return None;
    }
    let offered: Vec<(&str, &serde_json::Value)> = tools
        .names
        .iter()
        .map(String::as_str)
        .zip(&tools.schemas)
        .collect();
    Some(tool_grammar::forced(
        setup.format,
        &offered,
        false,
        control_id(setup.format, model),
    ))
}

/// The id of `format`'s control token in `model`'s vocabulary, where it has one.
fn control_id(format: crate::text::tools::ToolCallFormat, model: &ServedModel) -> Option<u32> {
    format
        .control_token()
        .and_then(|token| model.tokenizer.token_to_id(token))
}

/// How a requested output shape is kept: by a grammar the engine decodes under, or (a model
/// whose engine cannot, under `structured_output = "validate"`) by checking the output.
#[derive(Debug)]
enum Shaping {
    Grammar(Grammar),
    Check(OutputCheck),
}

/// How an output format (`response_format`, `text.format`, or an engine extension such as
/// `guided_regex`) is kept: the grammar it needs when the model can enforce one, else the
/// check of its answers when the model validates (JSON only), else a refusal.
fn shaping(
    output: &OutputFormat,
    extensions: &super::extensions::SamplingExtensions,
    names: ParamNames,
    model: &ServedModel,
) -> Result<Option<Shaping>, ApiError> {
    let guided = guided::requested(extensions)?;
    let (grammar, param, schema_param) = match (output, guided) {
        (OutputFormat::Text, None) => return Ok(None),
        (OutputFormat::Text, Some((Guided::Grammar(grammar), param))) => {
            return params::grammar(grammar, param, model).map(|g| Some(Shaping::Grammar(g)));
        }
        (OutputFormat::Text, Some((Guided::Json(schema), param))) => {
            prompt::check_schema(&schema, param)?;
            (Grammar::JsonSchema { schema }, param, param)
        }
        (_, Some((_, param))) => {
            return Err(ApiError::invalid(
                param,
                format!(
                    "'{param}' and '{}' cannot both shape the output",
                    names.output
                ),
            ));
        }
        (OutputFormat::JsonObject, None) => (Grammar::JsonObject, names.output, names.schema),
        (OutputFormat::JsonSchema(schema), None) => {
            prompt::check_schema(schema, names.schema)?;
            let schema = schema.clone();
            (Grammar::JsonSchema { schema }, names.output, names.schema)
        }
    };
    if model.info.capabilities.grammar || model.structured_output == StructuredOutput::Refuse {
        return params::grammar(grammar, param, model).map(|g| Some(Shaping::Grammar(g)));
    }
    let expected = match grammar {
        Grammar::JsonSchema { schema } => {
            Expected::Schema(Arc::new(validator(&schema, schema_param)?))
        }
        _ => Expected::JsonObject,
    };
    Ok(Some(Shaping::Check(OutputCheck::new(expected, param))))
}

/// A reasoning effort, one of OpenAI's words.
fn reasoning_effort(effort: Option<&str>, names: ParamNames) -> Result<Option<String>, ApiError> {
    match effort {
        None => Ok(None),
        Some(e @ ("none" | "minimal" | "low" | "medium" | "high" | "xhigh")) => {
            Ok(Some(e.to_string()))
        }
        Some(other) => Err(ApiError::invalid(
            names.reasoning_effort,
            format!(
                "'{other}' is not an effort; expected none, minimal, low, medium, high or xhigh"
            ),
        )),
    }
}
