-- Ends requests, each in one step, several per call (see redis/settle.rs and settle.rs). Per
-- request, each part optional:
--   its unused tokens go back to its buckets that still exist, never above capacity;
--   its unused spend is taken back from its tallies that still exist, never below zero (their
--   time to live stays);
--   its usage record is added to the day's sums (kept a while) and, when the log keeps it,
--   appended to the usage stream (capped near a length).
-- A usage journal's batch (journal.rs, merged by merge.rs) comes with a guard, its first and
-- last sequence numbers: it is applied only when it lies wholly past the journal's mark, which
-- it then raises to its last, so a batch sent twice or replayed after a restart counts once.
-- Returns 1 when applied, 0 when the mark is already at or past its last, -1 when the mark
-- falls inside it (the shipper reads the mark again and sends only what lies past it).
-- KEYS: with a guard the journal's mark, then per request: its nb buckets, its nt tallies, then
-- with a record the usage stream and the day's sums.
-- ARGV: the guard's first sequence number (0: no guard) and, with one, its last and the mark's
-- time to live (s); then per request: nb, the units given back, each bucket's capacity and
-- refill period (ms); nt, the amount refunded; 1 with a record (else 0), then the record, 1 when
-- the log keeps it, the log's cap, the sums' time to live (s), np, and np (sum name, amount)
-- pairs.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local a, k = 2, 1
if ARGV[1] ~= '0' then
  local mark = tonumber(redis.call('GET', KEYS[1]) or '0')
  if tonumber(ARGV[2]) <= mark then return 0 end
  if tonumber(ARGV[1]) <= mark then return -1 end
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  a, k = 4, 2
end
while a <= #ARGV do
  local nb, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  for i = 0, nb - 1 do
    local saved = redis.call('HMGET', KEYS[k + i], 'l', 't')
    if saved[1] then
      local cap = tonumber(ARGV[a + 2 * i])
      local period = tonumber(ARGV[a + 2 * i + 1])
      local elapsed = math.max(0, now - tonumber(saved[2]))
      local level = math.min(cap, tonumber(saved[1]) + elapsed * cap / period + amount)
      redis.call('HSET', KEYS[k + i], 'l', tostring(level), 't', now)
      redis.call('PEXPIRE', KEYS[k + i], period + 1000)
    end
  end
  k, a = k + nb, a + 2 * nb
  local nt, refund = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  for i = 0, nt - 1 do
    local count = tonumber(redis.call('GET', KEYS[k + i]) or '-1')
    if count >= 0 then
      local left = count - refund
      if left < 0 then left = 0 end
      redis.call('SET', KEYS[k + i], left, 'KEEPTTL')
    end
  end
  k = k + nt
  local recorded = ARGV[a]
  a = a + 1
  if recorded == '1' then
    local log, day = KEYS[k], KEYS[k + 1]
    if ARGV[a + 1] == '1' then
      redis.call('XADD', log, 'MAXLEN', '~', ARGV[a + 2], '*', 'r', ARGV[a])
    end
    local np = tonumber(ARGV[a + 4])
    for i = 0, np - 1 do
      redis.call('HINCRBY', day, ARGV[a + 5 + 2 * i], ARGV[a + 6 + 2 * i])
    end
    redis.call('EXPIRE', day, ARGV[a + 3])
    k, a = k + 2, a + 5 + 2 * np
  end
end
return 1
