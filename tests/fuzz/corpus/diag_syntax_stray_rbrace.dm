dim B = 4
}
input x : f32[B]
