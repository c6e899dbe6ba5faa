-- Adds ARGV[1] to every counter KEYS[i], or to none when one would pass its limit
-- ARGV[1 + i] (-1: none). A counter made here lapses after ARGV[1 + #KEYS + i] ms (0: never).
-- Returns {allowed (1/0), count of each counter after}.
local amount = tonumber(ARGV[1])
local n = #KEYS
local counts = {}
local fits = 1
for i = 1, n do
  counts[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  local limit = tonumber(ARGV[1 + i])
  if limit >= 0 and counts[i] + amount > limit then
    fits = 0
  end
end
if fits == 0 then
  return {0, unpack(counts)}
end
for i = 1, n do
  counts[i] = redis.call('INCRBY', KEYS[i], amount)
  local ttl = tonumber(ARGV[1 + n + i])
  if ttl > 0 and redis.call('PTTL', KEYS[i]) < 0 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return {1, unpack(counts)}
