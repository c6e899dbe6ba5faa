-- Commits revision ARGV[5] of record KEYS[1] (value ARGV[2]) and appends ARGV[3] to the log
-- KEYS[2] (replacing its entries when ARGV[6] is 1), keeping its newest ARGV[4] entries, only
-- while KEYS[1] is still at revision ARGV[1] (0: none yet). Returns 1 when it committed, 0 when
-- another writer got there first.
local current = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'rev', ARGV[5], 'val', ARGV[2])
if ARGV[6] == '1' then
  redis.call('DEL', KEYS[2])
end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
return 1
