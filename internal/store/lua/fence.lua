local fence = KEYS[1]
redis.call('SET', fence, '1', 'PX', 60000)
return 1
