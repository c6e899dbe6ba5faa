-- Commits revision ARGV[1] + 1 of record KEYS[1] (value ARGV[2]) and appends ARGV[3] to the log
-- KEYS[2], keeping its newest ARGV[4] entries, only while KEYS[1] is still at revision ARGV[1]
-- (0: none yet). Returns 1 when it committed, 0 when another writer got there first.
local current = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'rev', current + 1, 'val', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
return 1
