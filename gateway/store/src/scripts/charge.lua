-- Charges requests, several per call (see tally.rs and redis/charge.rs), each all or none: a
-- request's amount is added to every one of its counters, or to none when one would pass its
-- limit. A counter that held nothing before lapses after its time to live (its period's end, so
-- setting it again on a counter that went back to zero changes nothing).
-- KEYS, per request: its n counters.
-- ARGV, per request: n, the amount, n limits (-1: none), n times to live (ms, 0: never).
-- Returns, per request: 1 when charged (else 0), then each counter's count after.
local out = {}
local a, k = 1, 1
while a <= #ARGV do
  local n, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local counts, fits = {}, 1
  local held = n > 0 and redis.call('MGET', unpack(KEYS, k, k + n - 1)) or {}
  for i = 0, n - 1 do
    counts[i + 1] = tonumber(held[i + 1] or '0')
    local limit = tonumber(ARGV[a + 2 + i])
    if limit >= 0 and counts[i + 1] + amount > limit then
      fits = 0
    end
  end
  if fits == 1 then
    for i = 0, n - 1 do
      counts[i + 1] = redis.call('INCRBY', KEYS[k + i], amount)
      local ttl = tonumber(ARGV[a + 2 + n + i])
      if ttl > 0 and counts[i + 1] == amount then
        redis.call('PEXPIRE', KEYS[k + i], ttl)
      end
    end
  end
  out[#out + 1] = fits
  for i = 1, n do
    out[#out + 1] = counts[i]
  end
  k, a = k + n, a + 2 + 2 * n
end
return out
