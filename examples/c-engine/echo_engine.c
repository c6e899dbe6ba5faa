/* A minimal Turnpike engine plugin in C: model "echo-c" repeats the prompt back, one token per
 * millisecond, on a thread per request, then ends with its end-of-sequence token. Build it with
 * cc -std=c11 -O2 -fPIC -shared -pthread -I../../engine-api/include echo_engine.c -o libecho_c.so */
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "turnpike_engine.h"

#define VOCAB 32000u
#define EOS 2u

typedef struct Job {
    struct Job *next;
    struct TpEngine *engine;
    uint64_t id;
    uint32_t *prompt;
    size_t len;
    unsigned long max_tokens;
    int ignore_eos;
    TpSinkV1 sink;
    atomic_int cancelled, done;
    pthread_t thread;
} Job;

struct TpEngine {
    pthread_mutex_t lock;
    Job *jobs;
    atomic_ulong running, completed, cancelled;
};

static void say(TpWriter w, const char *text) {
    if (w.write) w.write(w.ctx, (const uint8_t *)text, strlen(text));
}

/* Naive lookup in the flat, compact object the host sends ({"max_tokens":16,"n":1,...}). */
static const char *find_key(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? at + strlen(pattern) : NULL;
}

static void *send_final(Job *job, TpStatus status, TpFinishReason reason, const TpUsage *usage) {
    TpEventV1 ev = {.struct_size = sizeof ev, .kind = TP_EVENT_FINAL, .status = status,
                    .finish_reason = reason, .usage = *usage};
    if (reason == TP_FINISH_STOP) ev.flags = TP_EVENT_FLAG_STOP_TOKEN, ev.stop_token_id = EOS;
    job->sink.on_event(job->sink.ctx, &ev);
    job->sink.release(job->sink.ctx); /* exactly once, after the last event */
    atomic_fetch_add(status == TP_STATUS_OK ? &job->engine->completed : &job->engine->cancelled, 1);
    atomic_fetch_sub(&job->engine->running, 1);
    atomic_store(&job->done, 1);
    return NULL;
}

static void *run(void *arg) {
    Job *job = arg;
    struct timespec tick = {0, 1000000};
    TpUsage usage = {(uint32_t)job->len, 0, 0};
    TpEventV1 ev = {.struct_size = sizeof ev, .kind = TP_EVENT_TOKEN};
    for (unsigned long i = 0; i < job->max_tokens; i++) {
        if (atomic_load(&job->cancelled))
            return send_final(job, TP_STATUS_CANCELLED, TP_FINISH_NONE, &usage);
        nanosleep(&tick, NULL);
        usage.completion_tokens++;
        if (i >= job->len && !(job->ignore_eos && job->len > 0))
            return send_final(job, TP_STATUS_OK, TP_FINISH_STOP, &usage); /* EOS: not a token */
        ev.token_id = job->prompt[i % job->len];
        job->sink.on_event(job->sink.ctx, &ev);
    }
    return send_final(job, TP_STATUS_OK, TP_FINISH_LENGTH, &usage);
}

static void reap(struct TpEngine *e, int all) { /* joins finished jobs (all: every job); locked */
    for (Job *job = e->jobs; all && job; job = job->next) atomic_store(&job->cancelled, 1);
    for (Job **link = &e->jobs; *link;) {
        Job *job = *link;
        if (!all && !atomic_load(&job->done)) { link = &job->next; continue; }
        pthread_join(job->thread, NULL);
        *link = job->next;
        free(job->prompt);
        free(job);
    }
}

static TpStatus create(const TpHostV1 *host, TpStr config, TpEngine **out, TpWriter err) {
    if (config.len > 0 && !(config.len == 2 && memcmp(config.ptr, "{}", 2) == 0)) {
        say(err, "the echo-c engine takes no configuration");
        return TP_STATUS_INVALID_CONFIG;
    }
    struct TpEngine *e = calloc(1, sizeof *e);
    if (!e) return TP_STATUS_INTERNAL;
    pthread_mutex_init(&e->lock, NULL);
    static const char ready[] = "echo-c engine ready";
    if (host && host->log) host->log(host->ctx, TP_LOG_INFO, (TpStr){ready, sizeof ready - 1});
    *out = e;
    return TP_STATUS_OK;
}

static void destroy(TpEngine *e) {
    pthread_mutex_lock(&e->lock);
    reap(e, 1); /* cancel and join every job: each sends its FINAL and release first */
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static TpStatus models(TpEngine *e, TpWriter out) {
    (void)e;
    say(out, "[{\"id\":\"echo-c\",\"max_context\":4096,\"vocab_size\":32000,\"eos_token_ids\":[2]}]");
    return TP_STATUS_OK;
}

static TpStatus refuse(TpSinkV1 sink, TpWriter err, TpStatus status, const char *why, Job *job) {
    say(err, why);
    if (job) free(job->prompt);
    free(job);
    if (sink.release) sink.release(sink.ctx); /* no events, but released exactly once */
    return status;
}

static TpStatus submit(TpEngine *e, const TpRequestV1 *req, TpSinkV1 sink, TpWriter err) {
    if (!req || req->struct_size < offsetof(TpRequestV1, params_json) + sizeof(TpStr))
        return refuse(sink, err, TP_STATUS_INVALID_REQUEST, "request too small", NULL);
    if (req->model.len != 6 || memcmp(req->model.ptr, "echo-c", 6) != 0)
        return refuse(sink, err, TP_STATUS_NOT_FOUND, "unknown model", NULL);
    size_t n = req->params_json.len;
    if (n < 2 || req->params_json.ptr[0] != '{' || req->params_json.ptr[n - 1] != '}')
        return refuse(sink, err, TP_STATUS_INVALID_REQUEST, "params_json is not an object", NULL);
    for (size_t i = 0; i < req->prompt.len; i++)
        if (req->prompt.ptr[i] >= VOCAB)
            return refuse(sink, err, TP_STATUS_INVALID_REQUEST, "token id out of range", NULL);
    Job *job = calloc(1, sizeof *job);
    char *params = malloc(n + 1);
    if (!job || !params || !(job->prompt = malloc((req->prompt.len + 1) * sizeof(uint32_t)))) {
        free(params);
        return refuse(sink, err, TP_STATUS_INTERNAL, "out of memory", job);
    }
    memcpy(params, req->params_json.ptr, n);
    params[n] = 0;
    const char *value = find_key(params, "n");
    int several = value && strtoul(value, NULL, 10) != 1;
    job->max_tokens = (value = find_key(params, "max_tokens")) ? strtoul(value, NULL, 10) : 16;
    job->ignore_eos = (value = find_key(params, "ignore_eos")) && *value == 't';
    free(params);
    if (several) return refuse(sink, err, TP_STATUS_UNSUPPORTED, "echo-c makes one choice", job);
    if (req->prompt.len) memcpy(job->prompt, req->prompt.ptr, req->prompt.len * sizeof(uint32_t));
    job->engine = e, job->id = req->id, job->len = req->prompt.len, job->sink = sink;
    pthread_mutex_lock(&e->lock);
    reap(e, 0);
    atomic_fetch_add(&e->running, 1);
    int started = pthread_create(&job->thread, NULL, run, job) == 0;
    if (started) job->next = e->jobs, e->jobs = job;
    else atomic_fetch_sub(&e->running, 1);
    pthread_mutex_unlock(&e->lock);
    return started ? TP_STATUS_OK : refuse(sink, err, TP_STATUS_INTERNAL, "no thread", job);
}

static TpStatus cancel(TpEngine *e, uint64_t id) {
    pthread_mutex_lock(&e->lock);
    for (Job *job = e->jobs; job; job = job->next)
        if (job->id == id) atomic_store(&job->cancelled, 1);
    pthread_mutex_unlock(&e->lock);
    return TP_STATUS_OK;
}

static TpStatus stats(TpEngine *e, TpWriter out) {
    char json[256];
    snprintf(json, sizeof json,
             "{\"queued\":0,\"running\":%lu,\"completed\":%lu,\"cancelled\":%lu,\"failed\":0}",
             atomic_load(&e->running), atomic_load(&e->completed), atomic_load(&e->cancelled));
    say(out, json);
    return TP_STATUS_OK;
}

static const TpEngineApiV1 API = {
    sizeof(TpEngineApiV1), TP_ABI_MAJOR, TP_ABI_MINOR, "echo-c", "0.1.0",
    create, destroy, models, submit, cancel, stats, NULL /* health */, NULL /* no embeddings */,
};

__attribute__((visibility("default"))) const TpEngineApiV1 *turnpike_engine_v1(void) {
    return &API;
}
