#!lua name=pivirt_registry
--[[
  The pivirt registry: pods (= clusters) and nodes, one record each whichever API made it
  (pb.CoreRPC or pivirt.cluster.v1). Loaded by every pivirt process on (re)connect, like the
  pivirt library (functions.lua). Errors are redis.error_reply('<CODE> <message>').

  The key schema and the record fields are described in shared/store/pv_registry.h. Conventions:
  - ARGV[1] is the key base "<prefix>{reg}:"; every registry key starts with it (one hash slot).
  - KEYS declare the name indexes a call is about (KEYS[1] = <base>pods or <base>nodes, ...).
    Records reached through an index (pod:<id>, node:<id>) are derived from ARGV[1].
  - Records are returned as flat field/value arrays (HGETALL), with the readers' extra fields
    appended: "n_nodes" for a pod; "alive", "workloads", "allocs" and, when the node's agent
    has reported one, "engine_info" for a node.
  - The C side validates names, JSON shapes and endpoints; these functions check what only
    Redis can know (existence, uniqueness, emptiness).
]]

local function pod_reply(base, id)
  local rec = redis.call('HGETALL', base .. 'pod:' .. id)
  if #rec == 0 then return nil end
  rec[#rec + 1] = 'n_nodes'
  rec[#rec + 1] = tostring(redis.call('SCARD', base .. 'pod-nodes:' .. id))
  return rec
end

local function node_reply(base, id)
  local rec = redis.call('HGETALL', base .. 'node:' .. id)
  if #rec == 0 then return nil end
  local name
  for i = 1, #rec, 2 do
    if rec[i] == 'name' then name = rec[i + 1] end
  end
  rec[#rec + 1] = 'alive'
  rec[#rec + 1] = tostring(redis.call('EXISTS', base .. 'alive:' .. (name or '')))
  rec[#rec + 1] = 'workloads'
  rec[#rec + 1] = tostring(redis.call('SCARD', base .. 'node-workloads:' .. id))
  rec[#rec + 1] = 'allocs'
  rec[#rec + 1] = tostring(redis.call('HLEN', base .. 'node-allocs:' .. id))
  local info = redis.call('GET', base .. 'engine-info:' .. (name or ''))
  if info then
    rec[#rec + 1] = 'engine_info'
    rec[#rec + 1] = info
  end
  return rec
end

local function sorted_names(index)
  local names = redis.call('HKEYS', index)
  table.sort(names)
  return names
end

-- pv_reg_get_pod and pv_reg_get_node: the record of the pod or node that value names ('name',
-- through index) or is ('id'), made by reply; else NOT_FOUND.
local function get_record(index, base, by, value, kind, reply)
  local id = value
  if by == 'name' then id = redis.call('HGET', index, value) end
  local rec = id and reply(base, id)
  if not rec then return err('NOT_FOUND', kind .. ' ' .. value .. ' not found') end
  return rec
end

-- The records of every name of index, name order.
local function list_records(index, base, reply)
  local out = {}
  for _, name in ipairs(sorted_names(index)) do
    local rec = reply(base, redis.call('HGET', index, name))
    if rec then out[#out + 1] = rec end
  end
  return out
end

--[[ pods ------------------------------------------------------------------------------------- ]]

-- pv_reg_add_pod(KEYS[1]=pods index, ARGV: base id name desc version cp_nodes worker_nodes
-- labels annotations) -> the record.
redis.register_function('pv_reg_add_pod', function(keys, args)
  local base, id, name = args[1], args[2], args[3]
  if redis.call('HEXISTS', keys[1], name) == 1 then
    return err('ALREADY_EXISTS', 'pod ' .. name .. ' already exists')
  end
  local now = tostring(now_ms())
  redis.call('HSET', base .. 'pod:' .. id, 'id', id, 'name', name, 'desc', args[4],
    'version', args[5], 'cp_nodes', args[6], 'worker_nodes', args[7], 'labels', args[8],
    'annotations', args[9], 'created_ms', now, 'updated_ms', now)
  redis.call('HSET', keys[1], name, id)
  return pod_reply(base, id)
end)

-- pv_reg_update_pod(KEYS[1]=pods index, ARGV: base name labels annotations cp_nodes
-- worker_nodes formed version) -> the record. An empty string leaves that field as it is; formed '1'
-- records the first time the cluster had its nodes (kept once set).
redis.register_function('pv_reg_update_pod', with_id(1, 'pod', function(keys, args, id)
  local base = args[1]
  local key, changes = base .. 'pod:' .. id, {}
  local fields = {'labels', 'annotations', 'cp_nodes', 'worker_nodes'}
  for i, f in ipairs(fields) do
    if args[2 + i] ~= '' then
      changes[#changes + 1] = f
      changes[#changes + 1] = args[2 + i]
    end
  end
  if args[8] and args[8] ~= '' then
    changes[#changes + 1] = 'version'
    changes[#changes + 1] = args[8]
  end
  if #changes > 0 then
    changes[#changes + 1] = 'updated_ms'
    changes[#changes + 1] = tostring(now_ms())
    redis.call('HSET', key, unpack(changes))
  end
  if args[7] == '1' then redis.call('HSETNX', key, 'formed_ms', tostring(now_ms())) end
  return pod_reply(base, id)
end))

-- pv_reg_remove_pod(KEYS[1]=pods index, ARGV: base name): refuses while the pod has nodes.
redis.register_function('pv_reg_remove_pod', with_id(1, 'pod', function(keys, args, id)
  local base, name = args[1], args[2]
  local busy = still('pod ' .. name, 'has', redis.call('SCARD', base .. 'pod-nodes:' .. id),
    'node(s): remove them first')
  if busy then return busy end
  redis.call('DEL', base .. 'pod:' .. id, base .. 'pod-nodes:' .. id)
  redis.call('HDEL', keys[1], name)
  return 1
end))

-- pv_reg_get_pod(KEYS[1]=pods index, ARGV: base 'name'|'id' value) -> the record.
redis.register_function{function_name = 'pv_reg_get_pod', flags = {'no-writes'},
  callback = function(keys, args)
    return get_record(keys[1], args[1], args[2], args[3], 'pod', pod_reply)
  end}

-- pv_reg_list_pods(KEYS[1]=pods index, ARGV: base) -> every record, name order.
redis.register_function{function_name = 'pv_reg_list_pods', flags = {'no-writes'},
  callback = function(keys, args) return list_records(keys[1], args[1], pod_reply) end}

--[[ nodes ------------------------------------------------------------------------------------ ]]

-- A node removed leaves the schedulers' change index (node_changed) and the liveness index
-- (node-alive: id -> when its alive key expires, 0 = not alive); the removal's sequence number
-- tells a scheduler that read the index before it to read the whole index again.
local function node_removed(base, id)
  local index = base .. 'node-index'
  redis.call('HSET', index, 'removed', redis.call('HINCRBY', index, 'seq', 1))
  redis.call('ZREM', base .. 'node-revs', id)
  redis.call('ZREM', base .. 'node-alive', id)
end

-- A node's engine TLS (Eru's ca, cert, key: secrets) lives apart from its record
-- (node-tls:<id>), so no reader of records ever carries it: only its agent asks
-- (pv_reg_get_node_tls). Each of ca cert key: '' keeps what is there.
local function set_tls(base, id, ca, cert, key)
  local tls = base .. 'node-tls:' .. id
  if ca ~= nil and ca ~= '' then redis.call('HSET', tls, 'ca', ca) end
  if cert ~= nil and cert ~= '' then redis.call('HSET', tls, 'cert', cert) end
  if key ~= nil and key ~= '' then redis.call('HSET', tls, 'key', key) end
end

-- pv_reg_add_node(KEYS[1]=nodes index, KEYS[2]=pods index, ARGV: base id name pod_name role ip
-- endpoint engine labels resources [ca cert key]) -> the record.
redis.register_function('pv_reg_add_node', function(keys, args)
  local base, id, name, pod_name = args[1], args[2], args[3], args[4]
  local pod_id, missing = find_id(keys[2], 'pod', pod_name)
  if not pod_id then return missing end
  if redis.call('HEXISTS', keys[1], name) == 1 then
    return err('ALREADY_EXISTS', 'node ' .. name .. ' already exists')
  end
  local now = tostring(now_ms())
  redis.call('HSET', base .. 'node:' .. id, 'id', id, 'name', name, 'pod_id', pod_id,
    'pod_name', pod_name, 'role', args[5], 'ip', args[6], 'endpoint', args[7], 'engine', args[8],
    'labels', args[9], 'resources', args[10], 'bypass', '0', 'created_ms', now,
    'updated_ms', now, 'rev', '1')
  set_tls(base, id, args[11], args[12], args[13])
  redis.call('HSET', keys[1], name, id)
  redis.call('SADD', base .. 'pod-nodes:' .. pod_id, id)
  redis.call('HSET', base .. 'pod:' .. pod_id, 'updated_ms', now)
  node_changed(base, id)
  redis.call('ZADD', base .. 'node-alive', 0, id)
  return node_reply(base, id)
end)

-- pv_reg_remove_node(KEYS[1]=nodes index, ARGV: base name): refuses while it hosts workloads.
redis.register_function('pv_reg_remove_node', with_id(1, 'node', function(keys, args, id)
  local base, name = args[1], args[2]
  local busy = still('node ' .. name, 'hosts',
      redis.call('SCARD', base .. 'node-workloads:' .. id), 'workload(s): remove them first') or
    still('node ' .. name, 'holds', redis.call('HLEN', base .. 'node-allocs:' .. id),
      'reserved allocation(s): let their deploys finish or release them first')
  if busy then return busy end
  local pod_id = redis.call('HGET', base .. 'node:' .. id, 'pod_id')
  redis.call('DEL', base .. 'node:' .. id, base .. 'node-workloads:' .. id,
    base .. 'alive:' .. name, base .. 'node-tls:' .. id)
  redis.call('HDEL', keys[1], name)
  node_removed(base, id)
  if pod_id then
    redis.call('SREM', base .. 'pod-nodes:' .. pod_id, id)
    if redis.call('EXISTS', base .. 'pod:' .. pod_id) == 1 then
      redis.call('HSET', base .. 'pod:' .. pod_id, 'updated_ms', tostring(now_ms()))
    end
  end
  return 1
end))

-- pv_reg_get_node(KEYS[1]=nodes index, ARGV: base 'name'|'id' value) -> the record.
redis.register_function{function_name = 'pv_reg_get_node', flags = {'no-writes'},
  callback = function(keys, args)
    return get_record(keys[1], args[1], args[2], args[3], 'node', node_reply)
  end}

-- pv_reg_list_nodes(KEYS[1]=nodes index, KEYS[2]=pods index, ARGV: base pod_name) -> the
-- records of the pod's nodes (every node when pod_name is ''), name order.
redis.register_function{function_name = 'pv_reg_list_nodes', flags = {'no-writes'},
  callback = function(keys, args)
    local base, pod_name = args[1], args[2]
    if pod_name == '' then return list_records(keys[1], base, node_reply) end
    local pod_id, missing = find_id(keys[2], 'pod', pod_name)
    if not pod_id then return missing end
    local out, by_name, names = {}, {}, {}
    for _, id in ipairs(redis.call('SMEMBERS', base .. 'pod-nodes:' .. pod_id)) do
      local name = redis.call('HGET', base .. 'node:' .. id, 'name')
      if name then
        by_name[name] = id
        names[#names + 1] = name
      end
    end
    table.sort(names)
    for _, name in ipairs(names) do out[#out + 1] = node_reply(base, by_name[name]) end
    return out
  end}

-- pv_reg_get_node_tls(KEYS[1]=nodes index, ARGV: base name) -> {ca, cert, key} ('' = none).
redis.register_function{function_name = 'pv_reg_get_node_tls', flags = {'no-writes'},
  callback = with_id(1, 'node', function(keys, args, id)
    local v = redis.call('HMGET', args[1] .. 'node-tls:' .. id, 'ca', 'cert', 'key')
    return {v[1] or '', v[2] or '', v[3] or ''}
  end)}

-- pv_reg_set_node(KEYS[1]=nodes index, ARGV: base name endpoint engine labels_mode labels
-- resources_mode resources bypass expected_usage_rev [ca cert key]) -> the record. endpoint '' keeps it;
-- labels_mode keep|replace|merge; resources_mode keep|replace; bypass keep|1|0;
-- expected_usage_rev '' = unconditional, else nothing is written unless the node's usage_rev
-- still has that value (ABORTED): resources computed from a usage that a reservation has
-- changed since are never stored.
redis.register_function('pv_reg_set_node', with_id(1, 'node', function(keys, args, id)
  local base, name = args[1], args[2]
  local key = base .. 'node:' .. id
  local want = args[10] or ''
  if want ~= '' then
    local rev = redis.call('HGET', key, 'usage_rev') or '0'
    if rev ~= want then
      return err('ABORTED', 'node ' .. name .. ': usage changed while its resources were ' ..
        'computed (usage_rev ' .. rev .. ', expected ' .. want .. ')')
    end
  end
  if args[3] ~= '' then redis.call('HSET', key, 'endpoint', args[3], 'engine', args[4]) end
  if args[5] == 'replace' then
    redis.call('HSET', key, 'labels', args[6])
  elseif args[5] == 'merge' then
    local ok, cur = pcall(cjson.decode, redis.call('HGET', key, 'labels') or '{}')
    if not ok or type(cur) ~= 'table' then cur = {} end
    for k, v in pairs(cjson.decode(args[6])) do cur[k] = v end
    local text = '{}'
    if next(cur) ~= nil then text = cjson.encode(cur) end
    redis.call('HSET', key, 'labels', text)
  end
  if args[7] == 'replace' then redis.call('HSET', key, 'resources', args[8]) end
  if args[9] ~= 'keep' then redis.call('HSET', key, 'bypass', args[9]) end
  set_tls(base, id, args[11], args[12], args[13])
  redis.call('HSET', key, 'updated_ms', tostring(now_ms()))
  redis.call('HINCRBY', key, 'rev', 1)
  node_changed(base, id)
  return node_reply(base, id)
end))

--[[ liveness --------------------------------------------------------------------------------- ]]

-- pv_reg_set_alive(KEYS[1]=nodes index, ARGV: base name ttl_seconds value): Eru's
-- SetNodeStatus. Returns 1 when the node was alive before the call, else 0.
redis.register_function('pv_reg_set_alive', function(keys, args)
  local base, name, ttl = args[1], args[2], tonumber(args[3])
  if not ttl or ttl == 0 or ttl ~= math.floor(ttl) then
    return err('INVALID_ARGUMENT', 'ttl: ' .. tostring(args[3]) ..
      ' is not a valid status ttl (seconds > 0 sets, < 0 deletes)')
  end
  local id = redis.call('HGET', keys[1], name)
  if not id then return err('NOT_FOUND', 'node ' .. name .. ' not found') end
  local key = base .. 'alive:' .. name
  local was = redis.call('EXISTS', key)
  local until_ms = 0
  if ttl < 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, args[4], 'EX', ttl)
    until_ms = now_ms() + ttl * 1000
  end
  redis.call('ZADD', base .. 'node-alive', until_ms, id)
  return was
end)

-- pv_reg_get_alive(KEYS[1]=nodes index, ARGV: base name) -> {alive 0|1, pod name}.
redis.register_function{function_name = 'pv_reg_get_alive', flags = {'no-writes'},
  callback = with_id(1, 'node', function(keys, args, id)
    local base, name = args[1], args[2]
    local pod = redis.call('HGET', base .. 'node:' .. id, 'pod_name') or ''
    return {redis.call('EXISTS', base .. 'alive:' .. name), pod}
  end)}

-- pv_reg_alive_nodes(KEYS[1]=nodes index, ARGV: base) -> names of the alive nodes, name order.
redis.register_function{function_name = 'pv_reg_alive_nodes', flags = {'no-writes'},
  callback = function(keys, args)
    local out = {}
    for _, name in ipairs(sorted_names(keys[1])) do
      if redis.call('EXISTS', args[1] .. 'alive:' .. name) == 1 then out[#out + 1] = name end
    end
    return out
  end}

-- pv_registry_version(): the schema version of the registry records, so a process can refuse to
-- run against records written by an incompatible build.
redis.register_function{function_name = 'pv_registry_version', flags = {'no-writes'},
  callback = function(keys, args) return 1 end}
