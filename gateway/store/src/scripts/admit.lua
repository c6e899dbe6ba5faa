-- Admits requests, several per call (see redis/admit.rs): token-bucket takes (request rates,
-- token reservations) and budget charges, in the order they came. A request's take and its
-- charge usually travel in the same call, so admitting a request costs one round trip.
--
-- A take ('t') takes its amount from every one of its buckets, or from none.
-- KEYS: its nb buckets. ARGV: 't', nb, the amount, each bucket's capacity and refill period (ms).
-- Answer: allowed, never, wait_ms, then each bucket's level * 1000.
--
-- A charge ('c') adds its amount to every one of its counters, or to none when one would pass
-- its limit. A counter that held nothing before lapses after its time to live (its period's end,
-- so setting it again on a counter that went back to zero changes nothing). The charges of a
-- call mostly share their counters (one tenant's, one key's), so each counter is read once, the
-- charges are decided in order against the counts as they stand after the ones before, and each
-- counter is written once at the end: the same counts and answers as one INCRBY per charge and
-- counter, for a fraction of the calls into Redis. (Takes and charges touch different keys, so
-- writing the counters last changes no take.)
-- KEYS: its n counters. ARGV: 'c', n, the amount, n limits (-1: none), n times to live (ms, 0:
-- never).
-- Answer: 1 when charged (else 0), then each counter's count after.
local now
local out = {}
local counts, read, lapse = {}, {}, {}
local a, k = 1, 1

local function take()
  if now == nil then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local nb, amount = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local levels = {}
  local allowed, never, wait = 1, 0, 0
  for i = 0, nb - 1 do
    local cap = tonumber(ARGV[a + 2 + 2 * i])
    local period = tonumber(ARGV[a + 3 + 2 * i])
    local saved = redis.call('HMGET', KEYS[k + i], 'l', 't')
    local level = cap
    if saved[1] then
      local elapsed = math.max(0, now - tonumber(saved[2]))
      level = math.min(cap, tonumber(saved[1]) + elapsed * cap / period)
    end
    if amount > cap then
      allowed = 0
      never = 1
    elseif level < amount then
      allowed = 0
      wait = math.max(wait, math.ceil((amount - level) * period / cap))
    end
    levels[i + 1] = level
  end
  out[#out + 1] = allowed
  out[#out + 1] = never
  out[#out + 1] = wait
  for i = 0, nb - 1 do
    if allowed == 1 then
      local period = tonumber(ARGV[a + 3 + 2 * i])
      levels[i + 1] = levels[i + 1] - amount
      redis.call('HSET', KEYS[k + i], 'l', tostring(levels[i + 1]), 't', now)
      redis.call('PEXPIRE', KEYS[k + i], period + 1000)
    end
    out[#out + 1] = math.floor(levels[i + 1] * 1000)
  end
  k, a = k + nb, a + 2 + 2 * nb
end

local function charge()
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

while a <= #ARGV do
  local kind = ARGV[a]
  a = a + 1
  if kind == 't' then
    take()
  else
    charge()
  end
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
