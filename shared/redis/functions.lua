#!lua name=pivirt
--[[
  The pivirt Redis function library, loaded by every process on (re)connect with
  FUNCTION LOAD REPLACE. Every multi-key update of the system is one of these functions, so it
  is atomic. Errors are returned as redis.error_reply('<CODE> <message>') with a gRPC status
  code name first; pv_redis maps them back to codes.
]]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- pv_heartbeat(KEYS[1]=presence key, [KEYS[2]=index zset], ARGV[1]=ttl ms, ARGV[2]=value,
-- [ARGV[3]=member]): one TTL'd presence key of a process (gateway, worker, scheduler, node
-- agent). With an index, the member is also kept in a sorted set scored by its expiry time, and
-- expired members are dropped from it, so the live set of a kind is one ZRANGEBYSCORE away
-- (no SCAN over the keyspace). Returns 1 when the key was new (the process appeared), 0 when it
-- was refreshed.
redis.register_function('pv_heartbeat', function(keys, args)
  local ttl = tonumber(args[1])
  if not ttl or ttl <= 0 then
    return redis.error_reply('INVALID_ARGUMENT ttl must be a positive number of ms, got ' .. tostring(args[1]))
  end
  local existed = redis.call('EXISTS', keys[1])
  redis.call('SET', keys[1], args[2], 'PX', ttl)
  if keys[2] then
    if not args[3] or args[3] == '' then
      return redis.error_reply('INVALID_ARGUMENT an index needs a member name')
    end
    local now = now_ms()
    redis.call('ZADD', keys[2], now + ttl, args[3])
    redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', '(' .. now)
  end
  if existed == 1 then return 0 end
  return 1
end)

-- pv_presence_leave(KEYS[1]=presence key, KEYS[2]=index zset, ARGV[1]=member): a process that
-- stops cleanly says so at once instead of waiting for its key to expire.
redis.register_function('pv_presence_leave', function(keys, args)
  redis.call('DEL', keys[1])
  redis.call('ZREM', keys[2], args[1])
  return 1
end)

-- pv_presence_live(KEYS[1]=index zset): the members whose presence has not expired.
redis.register_function{function_name = 'pv_presence_live', flags = {'no-writes'},
  callback = function(keys, args)
    return redis.call('ZRANGEBYSCORE', keys[1], '(' .. now_ms(), '+inf')
  end}
