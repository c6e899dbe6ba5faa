-- Starts idempotent request KEYS[1] with fingerprint ARGV[1], owned by ARGV[2] for ARGV[3] ms.
-- Returns {'started'}, {'running'}, {'conflict'} or {'done', record}.
local e = redis.call('HMGET', KEYS[1], 'fp', 'state', 'rec')
if not e[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'owner', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'started'}
end
if e[1] ~= ARGV[1] then
  return {'conflict'}
end
if e[2] == 'running' then
  return {'running'}
end
return {'done', e[3]}
