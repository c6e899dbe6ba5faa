-- Gives ARGV[1] units back to every bucket in KEYS that exists, never above capacity.
-- ARGV[2i], ARGV[2i+1]: capacity and refill period (ms) of KEYS[i].
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local amount = tonumber(ARGV[1])
for i = 1, #KEYS do
  local saved = redis.call('HMGET', KEYS[i], 'l', 't')
  if saved[1] then
    local cap = tonumber(ARGV[2 * i])
    local period = tonumber(ARGV[2 * i + 1])
    local elapsed = math.max(0, now - tonumber(saved[2]))
    local level = math.min(cap, tonumber(saved[1]) + elapsed * cap / period + amount)
    redis.call('HSET', KEYS[i], 'l', tostring(level), 't', now)
    redis.call('PEXPIRE', KEYS[i], period + 1000)
  end
end
return 1
