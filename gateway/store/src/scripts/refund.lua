-- Takes ARGV[1] back from every counter KEYS[i] that still exists, never below zero (its
-- time to live stays).
local amount = tonumber(ARGV[1])
for i = 1, #KEYS do
  local count = tonumber(redis.call('GET', KEYS[i]) or '-1')
  if count >= 0 then
    local left = count - amount
    if left < 0 then left = 0 end
    redis.call('SET', KEYS[i], left, 'KEEPTTL')
  end
end
return 0
