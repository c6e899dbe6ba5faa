/*
 * Turnpike gateway plugin ABI, major version 1.
 *
 * A gateway plugin is a shared library that exports turnpike_gateway_plugin_v1() (declared right
 * after the includes). It may guard requests, transform response text and offer server-side
 * tools. The rules (done exactly once per accepted tool call, no memory freed across the
 * boundary, no exception or panic escapes, hooks never block) are written out in
 * plugin-api/src/lib.rs and summarised on TgPluginApiV1 below.
 */

#ifndef TURNPIKE_GATEWAY_PLUGIN_H
#define TURNPIKE_GATEWAY_PLUGIN_H

/* Generated from plugin-api/src/abi.rs by cbindgen. Do not edit; regenerate with:
   cargo run -p turnpike-c-headers */

#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

struct TgPluginApiV1;

/* The entry point a plugin exports for ABI major 1. */
const struct TgPluginApiV1 *turnpike_gateway_plugin_v1(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

/*
 Major version of this ABI. A new major means a new entry symbol.
 */
#define TG_ABI_MAJOR 1

/*
 Minor version of this ABI. Minors only append fields and functions.
 */
#define TG_ABI_MINOR 0

/*
 Opaque plugin instance, created by `create` and owned by the host until `destroy`.
 */
typedef struct TgPlugin TgPlugin;

/*
 Opaque state of one response transform (one output text of one choice).
 */
typedef struct TgTransform TgTransform;

/*
 Outcome of a call. Values other than those below may appear in a later minor version; treat
 an unknown value as `TG_STATUS_INTERNAL`.
 */
typedef uint32_t TgStatus;

/*
 What a request guard decides.
 */
typedef uint32_t TgVerdict;

/*
 Severity of a log line sent to the host.
 */
typedef uint32_t TgLogLevel;

/*
 A borrowed UTF-8 string: not NUL-terminated, valid only for the duration of the call that
 passes it. `ptr` may be NULL when `len` is 0.
 */
typedef struct TgStr {
    /*
     First byte.
     */
    const char *ptr;
    /*
     Length in bytes.
     */
    size_t len;
} TgStr;

/*
 A host-provided output channel. The callee calls `write` zero or more times, from the thread
 running the call and before the call returns; the bytes are appended.
 */
typedef struct TgWriter {
    /*
     Opaque host context, passed back to `write`.
     */
    void *ctx;
    /*
     Appends `len` bytes from `data`. Never blocks, never fails; the host may cap what it keeps.
     */
    void (*write)(void *ctx, const uint8_t *data, size_t len);
} TgWriter;

/*
 Services the host offers a plugin. Passed to `create`; valid until `destroy` returns.
 */
typedef struct TgHostV1 {
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
    void (*log)(void *ctx, TgLogLevel level, struct TgStr message);
} TgHostV1;

/*
 Where a tool call's result goes. Owned by the plugin once `tool_call` returned
 `TG_STATUS_OK`; a refused call (any other status) never calls it.

 `done` is called exactly once per accepted call, from any thread, also when the call is
 cancelled (`TG_STATUS_CANCELLED`) or the plugin is destroyed. `result` is the tool's output
 text (`TG_STATUS_OK`) or an error message (`TG_STATUS_FAILED`, ...), borrowed for that call.
 After `done` the plugin never touches `ctx` again.
 */
typedef struct TgToolSinkV1 {
    /*
     Opaque host context.
     */
    void *ctx;
    /*
     Delivers the outcome.
     */
    void (*done)(void *ctx, TgStatus status, struct TgStr result);
} TgToolSinkV1;

/*
 The function table a plugin exports through `turnpike_gateway_plugin_v1`. Static: it lives as
 long as the library, which the host never unloads.

 `create` and `destroy` are required. Each hook is optional: NULL, or beyond `struct_size`,
 means the plugin does not offer it (`transform_open`, `transform_feed` and `transform_close`
 come together, as do `tool_call` and `tool_cancel`, and `describe` lists the tools).

 Every function except `create` and `destroy` may be called concurrently from any thread, and
 none lets a panic or C++ exception escape: failures are statuses. Hooks run on the request
 path: `guard` and `transform_feed` return promptly and never block on I/O; tool calls are
 asynchronous.

 The documents (JSON, UTF-8):
 - `describe` writes `{"tools": [{"name", "description", "parameters"}]}` (a JSON Schema each).
 - `guard` reads the request: `{"tenant", "model", "endpoint", "messages": [{"role",
   "content"}] | null, "prompt": [text, ...] | null, "tools": [name, ...], "metadata": {...}}`.
   With `TG_VERDICT_REJECT` it writes `{"status": 400..499, "code", "message"}`; with
   `TG_VERDICT_REWRITE` it writes the same document with message contents or prompt texts
   changed (only those are read back, by position; their number must not change).
 - `transform_open` reads `{"tenant", "model", "endpoint", "choice"}`.
 - `tool_call` reads `{"name", "arguments": {...}, "deadline_ms", "tenant", "model"}`.
 */
typedef struct TgPluginApiV1 {
    /*
     Size of this struct as the plugin knows it.
     */
    uint32_t struct_size;
    /*
     Must be `TG_ABI_MAJOR` (1).
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
     Required. Builds a plugin instance from `config` (a JSON document). On success stores it
     in `*out_plugin` and returns `TG_STATUS_OK`; on failure writes a one-line reason to `err`.
     */
    TgStatus (*create)(const struct TgHostV1 *host,
                       struct TgStr config,
                       struct TgPlugin **out_plugin,
                       struct TgWriter err);
    /*
     Required. Destroys an instance. Before it returns every accepted tool call has had its
     `done`, and every transform it opened has been closed by the host.
     */
    void (*destroy)(struct TgPlugin *plugin);
    /*
     Optional. Writes what the plugin offers (its tools) to `out`.
     */
    TgStatus (*describe)(struct TgPlugin *plugin, struct TgWriter out);
    /*
     Optional. Judges a request before it is tokenized: stores a `TG_VERDICT_*` in
     `*verdict`, and writes the rejection or the rewritten request to `out`.
     */
    TgStatus (*guard)(struct TgPlugin *plugin,
                      struct TgStr request,
                      struct TgWriter out,
                      TgVerdict *verdict);
    /*
     Optional. Opens the transform of one output text; `*out` receives its state.
     */
    TgStatus (*transform_open)(struct TgPlugin *plugin,
                               struct TgStr context,
                               struct TgTransform **out);
    /*
     Feeds the next piece of the output text; writes to `out` the text ready to be sent. It
     may hold back a tail (a secret that could continue in the next piece); `last` = 1 means
     no more text comes, and everything held is written. The text written over all calls must
     not depend on how the output was cut into pieces.
     */
    TgStatus (*transform_feed)(struct TgTransform *transform,
                               struct TgStr text,
                               uint32_t last,
                               struct TgWriter out);
    /*
     Frees a transform's state (after its last feed, or when the response is dropped).
     */
    void (*transform_close)(struct TgTransform *transform);
    /*
     Optional. Starts a call of one of the plugin's tools and returns without waiting. `id` is
     unique per instance; `tool_cancel` takes it. The outcome goes to `sink` (see
     `TgToolSinkV1`). On refusal writes a one-line reason to `err`.
     */
    TgStatus (*tool_call)(struct TgPlugin *plugin,
                          uint64_t id,
                          struct TgStr call,
                          struct TgToolSinkV1 sink,
                          struct TgWriter err);
    /*
     Asks a tool call to stop. Idempotent; unknown and finished ids are ignored; the call's
     `done` (`TG_STATUS_CANCELLED`, or its result if it won the race) may come later.
     */
    void (*tool_cancel)(struct TgPlugin *plugin, uint64_t id);
} TgPluginApiV1;

/*
 Signature of the entry symbol `turnpike_gateway_plugin_v1`.
 */
typedef const struct TgPluginApiV1 *(*TgEntryV1)(void);

/*
 Success.
 */
#define TG_STATUS_OK 0

/*
 `create` was given a configuration it cannot use.
 */
#define TG_STATUS_INVALID_CONFIG 1

/*
 The input document is not what the hook expects.
 */
#define TG_STATUS_INVALID_INPUT 2

/*
 The plugin does not do what was asked (an unknown tool).
 */
#define TG_STATUS_UNSUPPORTED 3

/*
 A bug or fault inside the plugin (a caught panic ends up here).
 */
#define TG_STATUS_INTERNAL 4

/*
 A tool call was cancelled (by `tool_cancel` or by `destroy`).
 */
#define TG_STATUS_CANCELLED 5

/*
 A tool call failed; its result is the error message, which the model is shown.
 */
#define TG_STATUS_FAILED 6

/*
 Let the request through unchanged.
 */
#define TG_VERDICT_ALLOW 0

/*
 Refuse it: the guard wrote `{"status": 4xx, "code": "...", "message": "..."}`.
 */
#define TG_VERDICT_REJECT 1

/*
 Let it through changed: the guard wrote the request document with its texts changed.
 */
#define TG_VERDICT_REWRITE 2

/*
 An error the operator must see.
 */
#define TG_LOG_ERROR 1

/*
 Something unexpected that the plugin survived.
 */
#define TG_LOG_WARN 2

/*
 Normal operation.
 */
#define TG_LOG_INFO 3

/*
 Detail for debugging.
 */
#define TG_LOG_DEBUG 4

#endif  /* TURNPIKE_GATEWAY_PLUGIN_H */
