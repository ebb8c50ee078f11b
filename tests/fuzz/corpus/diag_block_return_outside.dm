input x : f32[4]
return x
