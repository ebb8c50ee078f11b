dim A = 4000000000
input x : f32[A, A, A, A]
