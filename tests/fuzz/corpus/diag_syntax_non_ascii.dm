# Non-ASCII bytes are only allowed in comments: café
input café : f32[4]
