/* A minimal Turnpike gateway plugin in C, with every hook:
 *  - guard: refuses a request whose text holds the word "forbidden" (400 content_policy_violation);
 *  - transform: writes "darn" as "d**n" in responses, streamed or not (it holds back a tail that
 *    could be the start of the word, so a "darn" split between two pieces is caught too);
 *  - tool "unix_time": answers the current Unix time, at once.
 * Build it with
 * cc -std=c11 -O2 -fPIC -shared -I../../plugin-api/include mild_words.c -o libmild_words.so */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "turnpike_gateway_plugin.h"

struct TgPlugin { int unused; };

/* A transform's state: the tail held back from the last piece (at most three bytes). */
struct TgTransform { char held[4]; size_t len; };

static const char WORD[] = "darn";

static void say(TgWriter w, const char *data, size_t len) {
    if (w.write && len) w.write(w.ctx, (const uint8_t *)data, len);
}

static TgStatus create(const TgHostV1 *host, TgStr config, TgPlugin **out, TgWriter err) {
    (void)config;
    if (!host || !out) { say(err, "null argument", 13); return TG_STATUS_INVALID_INPUT; }
    /* This plugin takes no settings, but a configuration must still look like a JSON object. */
    size_t i = 0, j = config.len;
    while (i < j && (config.ptr[i] == ' ' || config.ptr[i] == '\n')) i++;
    while (j > i && (config.ptr[j - 1] == ' ' || config.ptr[j - 1] == '\n')) j--;
    if (config.len && (j - i < 2 || config.ptr[i] != '{' || config.ptr[j - 1] != '}')) {
        say(err, "the configuration is not a JSON object", 38);
        return TG_STATUS_INVALID_CONFIG;
    }
    TgPlugin *p = calloc(1, sizeof *p);
    if (!p) return TG_STATUS_INTERNAL;
    *out = p;
    return TG_STATUS_OK;
}

static void destroy(TgPlugin *p) { free(p); }

static TgStatus describe(TgPlugin *p, TgWriter out) {
    (void)p;
    static const char doc[] =
        "{\"tools\":[{\"name\":\"unix_time\",\"description\":\"The current time as Unix seconds.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{}}}]}";
    say(out, doc, sizeof doc - 1);
    return TG_STATUS_OK;
}

static int holds(TgStr s, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= s.len; i++)
        if (memcmp(s.ptr + i, needle, n) == 0) return 1;
    return 0;
}

static TgStatus guard(TgPlugin *p, TgStr request, TgWriter out, TgVerdict *verdict) {
    (void)p;
    if (!verdict) return TG_STATUS_INVALID_INPUT;
    if (holds(request, "forbidden")) {
        static const char no[] = "{\"status\":400,\"code\":\"content_policy_violation\","
                                 "\"message\":\"This gateway does not take requests that say that word.\"}";
        say(out, no, sizeof no - 1);
        *verdict = TG_VERDICT_REJECT;
    } else {
        *verdict = TG_VERDICT_ALLOW;
    }
    return TG_STATUS_OK;
}

static TgStatus transform_open(TgPlugin *p, TgStr context, TgTransform **out) {
    (void)p; (void)context;
    if (!out) return TG_STATUS_INVALID_INPUT;
    *out = calloc(1, sizeof **out);
    return *out ? TG_STATUS_OK : TG_STATUS_INTERNAL;
}

/* Sends `text` with every "darn" masked, except a tail that may be the word's beginning. */
static TgStatus transform_feed(TgTransform *t, TgStr piece, uint32_t last, TgWriter out) {
    if (!t) return TG_STATUS_INVALID_INPUT;
    size_t len = t->len + piece.len;
    char *text = malloc(len + 1);
    if (!text) return TG_STATUS_INTERNAL;
    memcpy(text, t->held, t->len);
    if (piece.len) memcpy(text + t->len, piece.ptr, piece.len);
    size_t keep = 0;
    if (!last) /* the longest tail that is a proper prefix of WORD */
        for (size_t k = 3; k > 0; k--)
            if (len >= k && memcmp(text + len - k, WORD, k) == 0) { keep = k; break; }
    size_t end = len - keep, i = 0, from = 0;
    while (i + 4 <= end) {
        if (memcmp(text + i, WORD, 4) == 0) {
            say(out, text + from, i - from);
            say(out, "d**n", 4);
            i += 4;
            from = i;
        } else {
            i++;
        }
    }
    say(out, text + from, end - from);
    memcpy(t->held, text + end, keep);
    t->len = keep;
    free(text);
    return TG_STATUS_OK;
}

static void transform_close(TgTransform *t) { free(t); }

static TgStatus tool_call(TgPlugin *p, uint64_t id, TgStr call, TgToolSinkV1 sink, TgWriter err) {
    (void)p; (void)id;
    if (!holds(call, "\"unix_time\"")) { say(err, "no such tool", 12); return TG_STATUS_UNSUPPORTED; }
    char answer[64];
    int n = snprintf(answer, sizeof answer, "{\"unix_time\":%lld}", (long long)time(NULL));
    TgStr result = { answer, (size_t)n };
    /* Answered before returning: the one `done` this accepted call gets. */
    if (sink.done) sink.done(sink.ctx, TG_STATUS_OK, result);
    return TG_STATUS_OK;
}

static void tool_cancel(TgPlugin *p, uint64_t id) { (void)p; (void)id; /* calls end at once */ }

static const TgPluginApiV1 API = {
    .struct_size = sizeof(TgPluginApiV1),
    .abi_major = 1,
    .abi_minor = 0,
    .name = "mild-words",
    .version = "0.1.0",
    .create = create,
    .destroy = destroy,
    .describe = describe,
    .guard = guard,
    .transform_open = transform_open,
    .transform_feed = transform_feed,
    .transform_close = transform_close,
    .tool_call = tool_call,
    .tool_cancel = tool_cancel,
};

__attribute__((visibility("default"))) const TgPluginApiV1 *turnpike_gateway_plugin_v1(void) {
    return &API;
}
