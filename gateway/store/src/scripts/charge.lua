-- Charges requests, several per call (see tally.rs and redis/charge.rs), each all or none: a
-- request's amount is added to every one of its counters, or to none when one would pass its
-- limit. A counter that held nothing before lapses after its time to live (its period's end, so
-- setting it again on a counter that went back to zero changes nothing).
-- The requests of a call mostly share their counters (one tenant's, one key's), so each counter
-- is read once, the requests are decided in order against the counts as they stand after the
-- ones before, and each counter is written once at the end: the same counts and answers as one
-- INCRBY per request and counter, for a fraction of the calls into Redis.
-- KEYS, per request: its n counters.
-- ARGV, per request: n, the amount, n limits (-1: none), n times to live (ms, 0: never).
-- Returns, per request: 1 when charged (else 0), then each counter's count after.
local out = {}
local counts, read, lapse = {}, {}, {}
local a, k = 1, 1
while a <= #ARGV do
  local n, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local unread = {}
  for i = 0, n - 1 do
    if counts[KEYS[k + i]] == nil then
      unread[#unread + 1] = KEYS[k + i]
    end
  end
  if #unread > 0 then
    local held = redis.call('MGET', unpack(unread))
    for j, key in ipairs(unread) do
      local count = tonumber(held[j] or '0')
      counts[key], read[key] = count, count
    end
  end
  local fits = 1
  for i = 0, n - 1 do
    local limit = tonumber(ARGV[a + 2 + i])
    if limit >= 0 and counts[KEYS[k + i]] + amount > limit then
      fits = 0
    end
  end
  if fits == 1 then
    for i = 0, n - 1 do
      local key = KEYS[k + i]
      counts[key] = counts[key] + amount
      local ttl = tonumber(ARGV[a + 2 + n + i])
      if ttl > 0 and counts[key] == amount then
        lapse[key] = ttl
      end
    end
  end
  out[#out + 1] = fits
  for i = 0, n - 1 do
    out[#out + 1] = counts[KEYS[k + i]]
  end
  k, a = k + n, a + 2 + 2 * n
end
for key, count in pairs(counts) do
  if count ~= read[key] or lapse[key] then
    redis.call('INCRBY', key, count - read[key])
  end
  if lapse[key] then
    redis.call('PEXPIRE', key, lapse[key])
  end
end
return out
