-- Raises the number under KEYS[1] to ARGV[1] unless it holds more; at ARGV[1], it is kept
-- another ARGV[2] ms. Returns what it holds after.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local mine = tonumber(ARGV[1])
if mine >= current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return mine
end
return current
