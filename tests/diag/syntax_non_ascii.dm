# Non-ASCII bytes are only allowed in comments: café
# Poor: three errors for one character.
input café : f32[4]
