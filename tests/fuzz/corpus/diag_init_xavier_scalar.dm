param s : f32[] = xavier
