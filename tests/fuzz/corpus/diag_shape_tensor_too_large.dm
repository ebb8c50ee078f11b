dim N = 1048576
input x : f32[N, N, 2]
