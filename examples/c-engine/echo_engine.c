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
    uint64_t id;
    uint32_t *prompt;
    size_t len;
    unsigned long max_tokens;
    int ignore_eos;
    TpSinkV1 sink;
    atomic_int cancelled, done, outcome;
    pthread_t thread;
} Job;

struct TpEngine {
    pthread_mutex_t lock;
    Job *jobs;
    atomic_ulong completed, cancelled;
};

static void say(TpWriter w, const char *text) {
    if (w.write) w.write(w.ctx, (const uint8_t *)text, strlen(text));
}

/* Naive JSON lookups, enough for the flat object the host sends ({"max_tokens":16,...}). */
static const char *find_key(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\"", key);
    const char *at = strstr(json, pattern);
    if (!at) return NULL;
    at += strlen(pattern);
    while (*at == ' ' || *at == ':') at++;
    return at;
}

static void *send_final(Job *job, TpStatus status, TpFinishReason reason, const TpUsage *usage) {
    TpEventV1 ev = {.struct_size = sizeof ev, .kind = TP_EVENT_FINAL, .status = status,
                    .finish_reason = reason, .usage = *usage};
    if (reason == TP_FINISH_STOP) ev.flags = TP_EVENT_FLAG_STOP_TOKEN, ev.stop_token_id = EOS;
    job->sink.on_event(job->sink.ctx, &ev);
    job->sink.release(job->sink.ctx); /* exactly once, after the last event */
    atomic_store(&job->outcome, (int)status);
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

static void reap(struct TpEngine *e, int all) { /* call with e->lock held */
    for (Job **link = &e->jobs; *link;) {
        Job *job = *link;
        if (!all && !atomic_load(&job->done)) { link = &job->next; continue; }
        if (all) atomic_store(&job->cancelled, 1);
        pthread_join(job->thread, NULL);
        if (atomic_load(&job->outcome) == TP_STATUS_OK) atomic_fetch_add(&e->completed, 1);
        else atomic_fetch_add(&e->cancelled, 1);
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
    if (host->log) host->log(host->ctx, TP_LOG_INFO, (TpStr){ready, sizeof ready - 1});
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

static TpStatus submit(TpEngine *e, const TpRequestV1 *req, TpSinkV1 sink, TpWriter err) {
    TpStatus status = TP_STATUS_INVALID_REQUEST;
    char params[4096] = {0};
    const char *value;
    Job *job = NULL;
    if (req->model.len != 6 || memcmp(req->model.ptr, "echo-c", 6) != 0) {
        say(err, "unknown model"), status = TP_STATUS_NOT_FOUND;
        goto refuse;
    }
    if (req->params_json.len < 2 || req->params_json.len >= sizeof params) goto bad_params;
    memcpy(params, req->params_json.ptr, req->params_json.len);
    if (params[0] != '{' || params[req->params_json.len - 1] != '}') goto bad_params;
    if ((value = find_key(params, "n")) && strtoul(value, NULL, 10) != 1) {
        say(err, "echo-c generates one choice"), status = TP_STATUS_UNSUPPORTED;
        goto refuse;
    }
    for (size_t i = 0; i < req->prompt.len; i++)
        if (req->prompt.ptr[i] >= VOCAB) { say(err, "token id out of range"); goto refuse; }
    job = calloc(1, sizeof *job);
    if (!job || !(job->prompt = malloc((req->prompt.len + 1) * sizeof(uint32_t)))) {
        status = TP_STATUS_INTERNAL;
        goto refuse;
    }
    memcpy(job->prompt, req->prompt.ptr, req->prompt.len * sizeof(uint32_t));
    job->id = req->id;
    job->len = req->prompt.len;
    job->max_tokens = (value = find_key(params, "max_tokens")) ? strtoul(value, NULL, 10) : 16;
    job->ignore_eos = (value = find_key(params, "ignore_eos")) && *value == 't';
    job->sink = sink;
    pthread_mutex_lock(&e->lock);
    reap(e, 0);
    int started = pthread_create(&job->thread, NULL, run, job) == 0;
    if (started) job->next = e->jobs, e->jobs = job;
    pthread_mutex_unlock(&e->lock);
    if (started) return TP_STATUS_OK;
    status = TP_STATUS_INTERNAL;
    goto refuse;
bad_params:
    say(err, "params_json is not a JSON object");
refuse: /* a refused request gets no events, but its sink is still released exactly once */
    if (job) free(job->prompt);
    free(job);
    sink.release(sink.ctx);
    return status;
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
    unsigned long running = 0;
    pthread_mutex_lock(&e->lock);
    for (Job *job = e->jobs; job; job = job->next) running += !atomic_load(&job->done);
    pthread_mutex_unlock(&e->lock);
    snprintf(json, sizeof json,
             "{\"queued\":0,\"running\":%lu,\"completed\":%lu,\"cancelled\":%lu,\"failed\":0}",
             running, atomic_load(&e->completed), atomic_load(&e->cancelled));
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
