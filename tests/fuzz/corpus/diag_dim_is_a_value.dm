input x : f32[3]
input z : f32[x]
