input x : f64[3]
