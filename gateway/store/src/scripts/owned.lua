-- Acts on idempotent request KEYS[1] only while it is running and owned by ARGV[1]:
-- ARGV[2] = 'keep' (extend by ARGV[3] ms), 'finish' (store record ARGV[4], kept ARGV[3] ms)
-- or 'abandon' (delete). Returns 1 when it acted.
local e = redis.call('HMGET', KEYS[1], 'state', 'owner')
if e[1] ~= 'running' or e[2] ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'keep' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
elseif ARGV[2] == 'finish' then
  redis.call('HSET', KEYS[1], 'state', 'done', 'rec', ARGV[4])
  redis.call('HDEL', KEYS[1], 'owner')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
