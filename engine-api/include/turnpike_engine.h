/*
 * Turnpike engine plugin ABI, major version 1.
 *
 * A plugin is a shared library that exports turnpike_engine_v1() (declared right after the
 * includes). The rules every plugin follows (FINAL exactly once, release exactly once, any thread,
 * never block, idempotent cancel, no memory freed across the boundary, no exception or panic
 * escapes) are written out in engine-api/src/lib.rs and summarised on TpSinkV1 and
 * TpEngineApiV1 below.
 */

#ifndef TURNPIKE_ENGINE_H
#define TURNPIKE_ENGINE_H

/* Generated from engine-api/src/abi.rs by cbindgen. Do not edit; regenerate with:
   cargo run -p turnpike-c-headers */

#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

struct TpEngineApiV1;

/* The entry point a plugin exports for ABI major 1. */
const struct TpEngineApiV1 *turnpike_engine_v1(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

/*
 Major version of this ABI. A new major means a new entry symbol (`turnpike_engine_v2`).
 */
#define TP_ABI_MAJOR 1

/*
 Minor version of this ABI. Minors only append fields and functions.

 - 1: `TpRequestV1.trace_context`.
 */
#define TP_ABI_MINOR 1

/*
 Event flag: `logprob` is set (`TP_EVENT_TOKEN`).
 */
#define TP_EVENT_FLAG_LOGPROB 1

/*
 Event flag: `stop_token_id` is set (`TP_EVENT_CHOICE_END`, `TP_EVENT_FINAL`).
 */
#define TP_EVENT_FLAG_STOP_TOKEN 2

/*
 Opaque engine instance, created by `create` and owned by the host until `destroy`.
 */
typedef struct TpEngine TpEngine;

/*
 Outcome of a call or of a request. Values other than those below may appear in a later minor
 version; treat an unknown value as `TP_STATUS_INTERNAL`.
 */
typedef uint32_t TpStatus;

/*
 What an event is.
 */
typedef uint32_t TpEventKind;

/*
 Why a choice stopped generating.
 */
typedef uint32_t TpFinishReason;

/*
 Severity of a log line sent to the host.
 */
typedef uint32_t TpLogLevel;

/*
 A borrowed UTF-8 string: not NUL-terminated, valid only for the duration of the call that
 passes it (or, in an event, of the `on_event` call). `ptr` may be NULL when `len` is 0.
 */
typedef struct TpStr {
    /*
     First byte.
     */
    const char *ptr;
    /*
     Length in bytes.
     */
    size_t len;
} TpStr;

/*
 A borrowed array of token ids, valid for the duration of the call that passes it.
 */
typedef struct TpTokens {
    /*
     First token id; may be NULL when `len` is 0.
     */
    const uint32_t *ptr;
    /*
     Number of token ids.
     */
    size_t len;
} TpTokens;

/*
 A host-provided output channel for variable-size results (model lists, stats, embeddings,
 error messages). The callee calls `write` zero or more times, from the thread running the call
 and before the call returns; the bytes are appended. This is how the ABI returns data without
 either side freeing the other's memory.
 */
typedef struct TpWriter {
    /*
     Opaque host context, passed back to `write`.
     */
    void *ctx;
    /*
     Appends `len` bytes from `data`. Never blocks, never fails; the host may cap what it keeps.
     */
    void (*write)(void *ctx, const uint8_t *data, size_t len);
} TpWriter;

/*
 Services the host offers a plugin. Passed to `create`; valid until `destroy` returns.
 */
typedef struct TpHostV1 {
    /*
     Size of this struct as the host knows it.
     */
    uint32_t struct_size;
    /*
     ABI major version of the host.
     */
    uint16_t abi_major;
    /*
     ABI minor version of the host.
     */
    uint16_t abi_minor;
    /*
     Opaque host context, passed back to `log`.
     */
    void *ctx;
    /*
     Writes one log line into the host's log stream. Any thread; never blocks for long.
     */
    void (*log)(void *ctx, TpLogLevel level, struct TpStr message);
} TpHostV1;

/*
 A generation request. Borrowed for the duration of `submit`: copy what you keep.
 */
typedef struct TpRequestV1 {
    /*
     Size of this struct as the host knows it.
     */
    uint32_t struct_size;
    /*
     Zero in v1.
     */
    uint32_t reserved;
    /*
     Host-assigned id, unique within one engine instance; `cancel` takes it.
     */
    uint64_t id;
    /*
     Id of the model to run, one of those `models` returned.
     */
    struct TpStr model;
    /*
     Prompt token ids.
     */
    struct TpTokens prompt;
    /*
     Generation parameters as a JSON object (max_tokens, temperature, top_p, top_k, min_p, seed,
     n, stop_token_ids, ignore_eos, logprobs, top_logprobs, penalties, grammar, priority, tenant,
     request_id, ...). Unknown keys must be ignored: the host sends a parameter only when the
     model's capabilities declare it.
     */
    struct TpStr params_json;
    /*
     Since minor 1: the W3C trace context of the host's span for this request
     (`traceparent`, e.g. `00-<32 hex trace id>-<16 hex span id>-01`), empty when the request
     is not traced or the host is older. A plugin may make its own spans children of it, and
     should send it on (as the `traceparent` header) to servers it calls for this request.
     */
    struct TpStr trace_context;
} TpRequestV1;

/*
 An embeddings request. Borrowed for the duration of `embed`.
 */
typedef struct TpEmbedRequestV1 {
    /*
     Size of this struct as the host knows it.
     */
    uint32_t struct_size;
    /*
     Zero in v1.
     */
    uint32_t reserved;
    /*
     Id of the model to run.
     */
    struct TpStr model;
    /*
     The inputs, one token array each.
     */
    const struct TpTokens *inputs;
    /*
     Number of inputs.
     */
    size_t num_inputs;
    /*
     Parameters as a JSON object (for example `{"dimensions": 256}`); may be empty.
     */
    struct TpStr params_json;
} TpEmbedRequestV1;

/*
 One alternative token and its log probability.
 */
typedef struct TpTopLogprob {
    /*
     Token id.
     */
    uint32_t token_id;
    /*
     Natural log of its probability.
     */
    float logprob;
} TpTopLogprob;

/*
 Token counts of a request, reported in its FINAL event.
 */
typedef struct TpUsage {
    /*
     Prompt tokens processed.
     */
    uint32_t prompt_tokens;
    /*
     Of those, tokens served from a prefix cache.
     */
    uint32_t cached_prompt_tokens;
    /*
     Tokens generated over all choices, stop tokens included.
     */
    uint32_t completion_tokens;
} TpUsage;

/*
 An event of a request, passed to the sink's `on_event`. Borrowed for that call only.

 A host ignores event kinds and flags it does not know; a plugin sends a kind added in a later
 minor only when the host's `TpHostV1.abi_minor` says the host knows it. `num_top_logprobs` is
 at most 20.
 Which fields are meaningful depends on `kind`:
 - `TP_EVENT_TOKEN`: `choice_index`, `token_id`, `logprob` (with `TP_EVENT_FLAG_LOGPROB`),
   `top_logprobs`/`num_top_logprobs` (most likely first). A matched end-of-sequence or stop
   token is not sent as a token: it is reported by `stop_token_id` when its choice ends.
 - `TP_EVENT_CHOICE_END`: `choice_index`, `finish_reason`, `stop_token_id` (with
   `TP_EVENT_FLAG_STOP_TOKEN`). Optional: a choice that ends without one takes the
   `finish_reason` and `stop_token_id` of the FINAL event.
 - `TP_EVENT_FINAL`: `status`, `finish_reason`, `stop_token_id`, `usage`, and `message` (a
   human-readable reason when `status` is not `TP_STATUS_OK`).
 */
typedef struct TpEventV1 {
    /*
     Size of this struct as the plugin knows it.
     */
    uint32_t struct_size;
    /*
     One of `TP_EVENT_*`.
     */
    TpEventKind kind;
    /*
     Which choice (0..n) the event belongs to.
     */
    uint32_t choice_index;
    /*
     `TP_EVENT_FLAG_*` bits.
     */
    uint32_t flags;
    /*
     The generated token.
     */
    uint32_t token_id;
    /*
     Log probability of `token_id`.
     */
    float logprob;
    /*
     The most likely alternatives, most likely first; NULL when none were asked for.
     */
    const struct TpTopLogprob *top_logprobs;
    /*
     Number of entries in `top_logprobs`.
     */
    uint32_t num_top_logprobs;
    /*
     One of `TP_FINISH_*`.
     */
    TpFinishReason finish_reason;
    /*
     The end-of-sequence or stop token that ended the choice.
     */
    uint32_t stop_token_id;
    /*
     One of `TP_STATUS_*`.
     */
    TpStatus status;
    /*
     Token counts.
     */
    struct TpUsage usage;
    /*
     Why the request failed; empty when it did not.
     */
    struct TpStr message;
} TpEventV1;

/*
 Where a request's events go. Owned by the plugin from the moment `submit` is called.

 - An accepted request (submit returned `TP_STATUS_OK`) gets exactly one FINAL event, after
   all its other events, also when it is cancelled, fails, or the engine is destroyed.
 - A refused request (submit returned anything else) gets no events at all.
 - Either way, `release` is called exactly once, after the last `on_event`; after it the
   plugin never touches `ctx` again.
 - `on_event` may be called from any thread, never concurrently for one request; it never
   blocks and never calls back into the engine.
 */
typedef struct TpSinkV1 {
    /*
     Opaque host context.
     */
    void *ctx;
    /*
     Delivers one event.
     */
    void (*on_event)(void *ctx, const struct TpEventV1 *event);
    /*
     Gives the sink back to the host.
     */
    void (*release)(void *ctx);
} TpSinkV1;

/*
 The function table a plugin exports through `turnpike_engine_v1`. Static: it lives as long as
 the library, which the host never unloads.

 `struct_size` must cover at least `create` through `cancel`; those five are required. `stats`,
 `health` and `embed` are optional: NULL, or beyond `struct_size`, means absent (NULL `embed`
 means "this plugin serves no embeddings"). Later minors append entries; the host calls an
 entry only when `struct_size` covers it.

 Every function except `create` and `destroy` may be called concurrently from any thread.
 No function lets a panic or C++ exception escape; failures are statuses.
 */
typedef struct TpEngineApiV1 {
    /*
     Size of this struct as the plugin knows it.
     */
    uint32_t struct_size;
    /*
     Must be `TP_ABI_MAJOR` (1).
     */
    uint16_t abi_major;
    /*
     The minor version the plugin was built against.
     */
    uint16_t abi_minor;
    /*
     Plugin name, NUL-terminated, static.
     */
    const char *name;
    /*
     Plugin version, NUL-terminated, static.
     */
    const char *version;
    /*
     Required. Builds an engine. `host` stays valid until `destroy`; `config` is a JSON
     document. On success stores the engine in `*out_engine` and returns `TP_STATUS_OK`; on
     failure writes a one-line reason to `err` and returns an error status.
     */
    TpStatus (*create)(const struct TpHostV1 *host,
                       struct TpStr config,
                       struct TpEngine **out_engine,
                       struct TpWriter err);
    /*
     Required. Destroys an engine. Before it returns, every accepted request has had its FINAL
     event (`TP_STATUS_CANCELLED` for those still running) and its `release`. The host calls
     nothing else on the engine during or after `destroy`.
     */
    void (*destroy)(struct TpEngine *engine);
    /*
     Required. Writes the served models to `out` as a JSON array of model descriptors
     (`[{"id": ..., "max_context": ..., "vocab_size": ..., ...}]`); on failure writes a reason.
     */
    TpStatus (*models)(struct TpEngine *engine, struct TpWriter out);
    /*
     Required. Starts a request and returns without waiting for generation. Takes ownership of
     `sink` whatever it returns (see `TpSinkV1`). On refusal writes a one-line reason to `err`.
     */
    TpStatus (*submit)(struct TpEngine *engine,
                       const struct TpRequestV1 *request,
                       struct TpSinkV1 sink,
                       struct TpWriter err);
    /*
     Required. Asks the engine to stop a request. Idempotent and asynchronous: the FINAL event
     may come later, from another thread. Unknown and finished ids are ignored.
     */
    TpStatus (*cancel)(struct TpEngine *engine, uint64_t request_id);
    /*
     Optional. Writes counters to `out` as a JSON object with at least `queued`, `running`,
     `completed`, `cancelled` and `failed`.
     */
    TpStatus (*stats)(struct TpEngine *engine, struct TpWriter out);
    /*
     Optional. Returns `TP_STATUS_OK` when the engine can serve, another status when it cannot,
     and may write a one-line explanation to `out`.
     */
    TpStatus (*health)(struct TpEngine *engine, struct TpWriter out);
    /*
     Optional: NULL when the plugin serves no embeddings. Computes one vector per input and
     writes them to `out` as `num_inputs * dim` little-endian floats, input after input; on
     failure writes a reason instead.
     */
    TpStatus (*embed)(struct TpEngine *engine,
                      const struct TpEmbedRequestV1 *request,
                      struct TpWriter out);
} TpEngineApiV1;

/*
 Signature of the entry symbol `turnpike_engine_v1`.
 */
typedef const struct TpEngineApiV1 *(*TpEntryV1)(void);

/*
 Success.
 */
#define TP_STATUS_OK 0

/*
 The request was cancelled (by `cancel` or by `destroy`).
 */
#define TP_STATUS_CANCELLED 1

/*
 The request is malformed or out of range for this engine (bad parameters, bad token ids).
 */
#define TP_STATUS_INVALID_REQUEST 2

/*
 The request names a model this engine does not serve.
 */
#define TP_STATUS_NOT_FOUND 3

/*
 The engine is at capacity; the same request may succeed later.
 */
#define TP_STATUS_OVERLOADED 4

/*
 The engine cannot serve right now (starting, shutting down, device lost).
 */
#define TP_STATUS_UNAVAILABLE 5

/*
 The engine does not support what was asked (a parameter, embeddings, `n` > 1, ...).
 */
#define TP_STATUS_UNSUPPORTED 6

/*
 A bug or fault inside the engine (a caught panic ends up here).
 */
#define TP_STATUS_INTERNAL 7

/*
 `create` was given a configuration it cannot use.
 */
#define TP_STATUS_INVALID_CONFIG 8

/*
 One generated token of one choice.
 */
#define TP_EVENT_TOKEN 1

/*
 One choice of a request with `n` > 1 has ended; other choices continue.
 */
#define TP_EVENT_CHOICE_END 2

/*
 The request has ended. Exactly one per accepted request, and the last event.
 */
#define TP_EVENT_FINAL 3

/*
 No finish reason: the request was cancelled or failed.
 */
#define TP_FINISH_NONE 0

/*
 An end-of-sequence token or one of the request's stop token ids was generated.
 */
#define TP_FINISH_STOP 1

/*
 `max_tokens` was reached, or the context window is full.
 */
#define TP_FINISH_LENGTH 2

/*
 An error the operator must see.
 */
#define TP_LOG_ERROR 1

/*
 Something unexpected that the engine survived.
 */
#define TP_LOG_WARN 2

/*
 Normal operation (model loaded, device chosen).
 */
#define TP_LOG_INFO 3

/*
 Detail for debugging.
 */
#define TP_LOG_DEBUG 4

/*
 Very fine detail.
 */
#define TP_LOG_TRACE 5

#endif  /* TURNPIKE_ENGINE_H */
